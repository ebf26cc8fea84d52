package io.athenz.k8s.zts;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.yahoo.athenz.common.server.store.ChangeLogStore;
import com.yahoo.athenz.zms.SignedDomain;
import com.yahoo.athenz.zms.SignedDomains;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * ZTS's domain data from a directory of signed domain files, in place of ZMS.
 *
 * <p>The directory is the only truth: ZTS keeps what it loaded in memory, so nothing is saved
 * back ({@code saveLocalDomain} and {@code removeLocalDomain} do nothing) and there is no local
 * copy to start from ({@code getLocalDomainList} is empty). The first update after start returns
 * every file; each later one the files modified since the previous one. ZTS verifies every
 * domain's signature against the ZMS public keys of its athenz.conf as it would ZMS's, so a file
 * this store serves is trusted only if the ZMS key signed it.
 */
public class DomainFilesChangeLogStore implements ChangeLogStore {

    private static final Logger LOG = LoggerFactory.getLogger(DomainFilesChangeLogStore.class);

    private final Path dir;
    /** ZTS reads the files as it reads ZMS's answers: fields it does not know are skipped. */
    private final ObjectMapper mapper =
            new ObjectMapper().configure(DeserializationFeature.FAIL_ON_UNKNOWN_PROPERTIES, false);
    /** Files modified after this (epoch ms) are the next update; 0: every file. */
    private volatile long lastModified;

    public DomainFilesChangeLogStore(Path dir) {
        this.dir = dir;
    }

    @Override
    public SignedDomain getLocalSignedDomain(String domainName) {
        return null;
    }

    @Override
    public SignedDomain getServerSignedDomain(String domainName) {
        try {
            return DomainFiles.readSigned(mapper, dir, domainName);
        } catch (IOException | IllegalArgumentException ex) {
            LOG.error("domain files: {}", ex.getMessage());
            return null;
        }
    }

    @Override
    public void removeLocalDomain(String domainName) {
        // the directory is the truth; ZTS drops the domain from its own cache
    }

    @Override
    public void saveLocalDomain(String domainName, SignedDomain signedDomain) {
        // the directory is the truth; nothing is written back into it
    }

    @Override
    public List<String> getLocalDomainList() {
        return Collections.emptyList();
    }

    @Override
    public Set<String> getServerDomainList() {
        try {
            return new HashSet<>(DomainFiles.domainsIn(dir));
        } catch (IOException ex) {
            LOG.error("domain files: cannot list {}: {}", dir, ex.getMessage());
            return null;
        }
    }

    @Override
    public SignedDomains getServerDomainModifiedList() {
        return signedDomainsModifiedAfter(0);
    }

    @Override
    public SignedDomains getUpdatedSignedDomains(StringBuilder lastModTimeBuffer) {
        // taken before listing: a file written during the scan is returned again next time,
        // never missed
        long scanStart = System.currentTimeMillis();
        SignedDomains updated = signedDomainsModifiedAfter(lastModified);
        lastModTimeBuffer.setLength(0);
        lastModTimeBuffer.append(scanStart);
        return updated;
    }

    /**
     * The signed domains of the files modified after {@code after}; null (ZTS then reports the
     * update failed) when the directory cannot be read. A bad file is left out and logged by
     * name, so one broken domain cannot keep the others from ZTS.
     */
    private SignedDomains signedDomainsModifiedAfter(long after) {
        List<SignedDomain> domains = new ArrayList<>();
        try {
            for (String domain : DomainFiles.domainsIn(dir)) {
                Path file = DomainFiles.fileOf(dir, domain);
                // a file stamped in the very millisecond the last scan began may have been
                // listed before it was moved in: served again rather than missed
                if (Files.getLastModifiedTime(file).toMillis() < after) {
                    continue;
                }
                try {
                    domains.add(DomainFiles.readSigned(mapper, dir, domain));
                } catch (IOException | UncheckedIOException ex) {
                    LOG.error("domain files: skipping {}: {}", file, ex.getMessage());
                }
            }
        } catch (IOException ex) {
            LOG.error("domain files: cannot list {}: {}", dir, ex.getMessage());
            return null;
        }
        return new SignedDomains().setDomains(domains);
    }

    @Override
    public void setLastModificationTimestamp(String lastModTime) {
        if (lastModTime == null) {
            lastModified = 0;
            return;
        }
        try {
            lastModified = Long.parseLong(lastModTime);
        } catch (NumberFormatException ex) {
            LOG.error("domain files: ignoring modification time {}", DomainFiles.quote(lastModTime));
        }
    }

    @Override
    public boolean supportsFullRefresh() {
        return false;
    }
}
