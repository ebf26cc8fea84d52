package io.athenz.k8s.zts;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.yahoo.athenz.zms.DomainData;
import com.yahoo.athenz.zms.SignedDomain;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** What the store and the signer accept as a domain file, and what they refuse by name. */
class DomainFilesTest {

    private final ObjectMapper mapper = new ObjectMapper();

    @TempDir
    Path dir;

    @Test
    void domainNamesAreCheckedBeforeTheyBecomePaths() {
        assertTrue(DomainFiles.isDomainName("media.sports"));
        assertTrue(DomainFiles.isDomainName("sys.auth"));
        for (String bad : new String[] {"", ".", "..", "../etc", "a/b", "a..b", "a.", "-a", "a b", "a\u0000b",
                "x".repeat(257)}) {
            assertFalse(DomainFiles.isDomainName(bad), bad);
        }
        IllegalArgumentException refused =
                assertThrows(IllegalArgumentException.class, () -> DomainFiles.fileOf(dir, "../etc/passwd"));
        assertTrue(refused.getMessage().contains("not a domain name: \"../etc/passwd\""), refused.getMessage());
    }

    @Test
    void otherFilesAndBadNamesAreNotDomains() throws IOException {
        Files.writeString(dir.resolve("media.sports.json"), "{}");
        Files.writeString(dir.resolve("notes.txt"), "x");
        Files.writeString(dir.resolve("..json"), "{}");
        Files.writeString(dir.resolve(".media.tmp"), "{}");
        assertEquals(java.util.List.of("media.sports"), DomainFiles.domainsIn(dir));
    }

    @Test
    void anOversizedFileIsRefusedUnread() throws IOException {
        Path big = dir.resolve("big.json");
        Files.write(big, new byte[(int) DomainFiles.MAX_FILE_BYTES + 1]);
        IOException refused = assertThrows(IOException.class, () -> DomainFiles.read(big));
        assertTrue(refused.getMessage().contains("larger than " + DomainFiles.MAX_FILE_BYTES), refused.getMessage());
    }

    @Test
    void aSignedFileMustBeAboutItsDomainAndSigned() throws IOException {
        write("media.sports", new SignedDomain().setDomain(new DomainData().setName("other.domain")).setSignature("s"));
        IOException other = assertThrows(IOException.class,
                () -> DomainFiles.readSigned(mapper, dir, "media.sports"));
        assertTrue(other.getMessage().contains("its domain.name is \"other.domain\""), other.getMessage());

        write("media.sports", new SignedDomain().setDomain(new DomainData().setName("media.sports")));
        IOException unsigned = assertThrows(IOException.class,
                () -> DomainFiles.readSigned(mapper, dir, "media.sports"));
        assertTrue(unsigned.getMessage().contains("is not signed"), unsigned.getMessage());
    }

    @Test
    void malformedAndHostileJsonIsRefused() throws IOException {
        Files.writeString(dir.resolve("media.sports.json"), "{\"domain\": ");
        assertThrows(IOException.class, () -> DomainFiles.readSigned(mapper, dir, "media.sports"));
        // nested 10,000 deep: Jackson's nesting limit refuses it before it costs a stack
        Files.writeString(dir.resolve("media.sports.json"), "[".repeat(10_000) + "]".repeat(10_000));
        assertThrows(IOException.class, () -> DomainFiles.readSigned(mapper, dir, "media.sports"));
    }

    private void write(String name, SignedDomain signed) throws IOException {
        Files.write(dir.resolve(name + ".json"), mapper.writeValueAsBytes(signed));
    }
}
