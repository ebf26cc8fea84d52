package io.athenz.k8s.zts;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.yahoo.athenz.zms.DomainData;
import com.yahoo.athenz.zms.SignedDomain;
import com.yahoo.athenz.zms.SignedDomains;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.FileTime;
import java.util.List;
import java.util.Set;
import java.util.stream.Collectors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The store as ZTS's DataStore drives it: every domain first, then what changed. */
class DomainFilesChangeLogStoreTest {

    @TempDir
    Path dir;

    @Test
    void firstEveryDomainThenOnlyTheChangedOnes() throws IOException {
        write("media.sports", 1_000);
        write("sys.auth", 1_000);
        DomainFilesChangeLogStore store = new DomainFilesChangeLogStore(dir);
        assertTrue(store.getLocalDomainList().isEmpty(), "no local copy: the directory is the truth");

        StringBuilder lastModified = new StringBuilder();
        assertEquals(Set.of("media.sports", "sys.auth"), names(store.getUpdatedSignedDomains(lastModified)));
        store.setLastModificationTimestamp(lastModified.toString());
        assertTrue(names(store.getUpdatedSignedDomains(lastModified)).isEmpty());
        store.setLastModificationTimestamp(lastModified.toString());

        // one stamped in the millisecond the last scan began is served again, never missed
        write("sys.auth", Long.parseLong(lastModified.toString()));
        assertEquals(Set.of("sys.auth"), names(store.getUpdatedSignedDomains(lastModified)));
        store.setLastModificationTimestamp(lastModified.toString());

        // a domain written after the last look is the next update, alone
        write("media.sports", System.currentTimeMillis() + 60_000);
        assertEquals(Set.of("media.sports"), names(store.getUpdatedSignedDomains(lastModified)));

        // ZTS asks for a full refresh with null
        store.setLastModificationTimestamp(null);
        assertEquals(2, store.getUpdatedSignedDomains(new StringBuilder()).getDomains().size());
    }

    @Test
    void aBadFileIsLeftOutAndTheOthersServed() throws IOException {
        write("media.sports", 1_000);
        Files.writeString(dir.resolve("news.json"), "not json");
        DomainFilesChangeLogStore store = new DomainFilesChangeLogStore(dir);
        assertEquals(Set.of("media.sports"), names(store.getUpdatedSignedDomains(new StringBuilder())));
        assertNull(store.getServerSignedDomain("news"));
        assertNull(store.getServerSignedDomain("../media.sports"));
        assertEquals(Set.of("media.sports", "news"), store.getServerDomainList());
        assertFalse(store.supportsFullRefresh());
    }

    @Test
    void anUnreadableDirectoryIsAFailedUpdateNotAnEmptyOne() {
        DomainFilesChangeLogStore store = new DomainFilesChangeLogStore(dir.resolve("absent"));
        assertNull(store.getUpdatedSignedDomains(new StringBuilder()));
    }

    private void write(String name, long modifiedMillis) throws IOException {
        SignedDomain signed = new SignedDomain().setDomain(new DomainData().setName(name)).setSignature("s").setKeyId("0");
        Path file = dir.resolve(name + ".json");
        Files.write(file, new ObjectMapper().writeValueAsBytes(signed));
        Files.setLastModifiedTime(file, FileTime.fromMillis(modifiedMillis));
    }

    private static Set<String> names(SignedDomains domains) {
        List<SignedDomain> list = domains.getDomains();
        return list.stream().map(d -> d.getDomain().getName()).collect(Collectors.toSet());
    }
}
