package io.athenz.k8s.zts;

import com.yahoo.athenz.common.server.store.ChangeLogStore;
import com.yahoo.athenz.common.server.store.ChangeLogStoreFactory;

import java.nio.file.Files;
import java.nio.file.Path;
import java.security.PrivateKey;

/**
 * Makes ZTS read its domains from {@link DomainFilesChangeLogStore}: set
 * {@code athenz.zts.change_log_store_factory_class} to this class and {@value #DIR_PROPERTY} to
 * the directory of signed domain files. ZTS's own key (passed in for calls to ZMS) is not used:
 * there is no ZMS to call.
 */
public class DomainFilesChangeLogStoreFactory implements ChangeLogStoreFactory {

    public static final String DIR_PROPERTY = "athenz.k8s.domain_files_dir";

    @Override
    public ChangeLogStore create(String ztsHomeDir, PrivateKey privateKey, String privateKeyId) {
        String dir = System.getProperty(DIR_PROPERTY);
        if (dir == null || dir.isEmpty()) {
            throw new IllegalStateException(DIR_PROPERTY + " is not set: the directory of signed domain files");
        }
        Path path = Path.of(dir);
        if (!Files.isDirectory(path)) {
            throw new IllegalStateException(DIR_PROPERTY + "=" + dir + " is not a directory");
        }
        return new DomainFilesChangeLogStore(path);
    }
}
