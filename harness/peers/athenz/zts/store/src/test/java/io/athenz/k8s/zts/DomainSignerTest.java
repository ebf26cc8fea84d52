package io.athenz.k8s.zts;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.yahoo.athenz.auth.util.Crypto;
import com.yahoo.athenz.common.utils.SignUtils;
import com.yahoo.athenz.zms.SignedDomain;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.spec.ECGenParameterSpec;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The signer signs what ZTS verifies: Athenz's canonical string of the domain, with the ZMS key. */
class DomainSignerTest {

    private static KeyPair zms;

    @TempDir
    Path in;
    @TempDir
    Path out;

    @BeforeAll
    static void key() throws Exception {
        KeyPairGenerator generator = KeyPairGenerator.getInstance("EC");
        generator.initialize(new ECGenParameterSpec("secp256r1"));
        zms = generator.generateKeyPair();
    }

    private static final String DOMAIN = "{\"name\":\"media.sports\",\"modified\":\"2026-12-05T00:00:00.000Z\","
            + "\"roles\":[{\"name\":\"media.sports:role.readers\",\"roleMembers\":[{\"memberName\":\"media.sports.web\"}]}],"
            + "\"policies\":{\"contents\":{\"domain\":\"media.sports\",\"policies\":[{\"name\":\"media.sports:policy.p\","
            + "\"assertions\":[{\"role\":\"media.sports:role.readers\",\"resource\":\"media.sports:service.*\","
            + "\"action\":\"launch\",\"effect\":\"ALLOW\"}]}]},\"signature\":\"\",\"keyId\":\"\"},"
            + "\"services\":[{\"name\":\"media.sports.web\"}],\"entities\":[],\"groups\":[]}";

    @Test
    void whatItSignsVerifiesAsZtsVerifiesIt() throws IOException {
        Files.writeString(in.resolve("media.sports.json"), DOMAIN);
        assertEquals(1, DomainSigner.sign(zms.getPrivate(), "0", in, out));
        // read back as ZTS's store reads it
        SignedDomain signed = new ObjectMapper().readValue(out.resolve("media.sports.json").toFile(), SignedDomain.class);
        assertEquals("0", signed.getKeyId());
        assertTrue(Crypto.verify(SignUtils.asCanonicalString(signed.getDomain()), zms.getPublic(), signed.getSignature()));
        assertTrue(Crypto.verify(SignUtils.asCanonicalString(signed.getDomain().getPolicies().getContents()),
                zms.getPublic(), signed.getDomain().getPolicies().getSignature()));
        // a domain changed after signing no longer verifies
        signed.getDomain().getRoles().get(0).getRoleMembers().get(0).setMemberName("media.sports.evil");
        assertFalse(Crypto.verify(SignUtils.asCanonicalString(signed.getDomain()), zms.getPublic(), signed.getSignature()));
    }

    @Test
    void aFieldZmsDoesNotDefineStopsTheRunByName() throws IOException {
        Files.writeString(in.resolve("media.sports.json"), DOMAIN.replace("\"groups\":[]", "\"groups\":[],\"grups\":1"));
        IOException refused = assertThrows(IOException.class, () -> DomainSigner.sign(zms.getPrivate(), "0", in, out));
        assertTrue(refused.getMessage().contains("media.sports.json") && refused.getMessage().contains("grups"),
                refused.getMessage());
        assertFalse(Files.exists(out.resolve("media.sports.json")), "nothing of a bad run is written");
    }

    @Test
    void aFileOfAnotherDomainIsRefused() throws IOException {
        Files.writeString(in.resolve("news.json"), DOMAIN);
        IOException refused = assertThrows(IOException.class, () -> DomainSigner.sign(zms.getPrivate(), "0", in, out));
        assertTrue(refused.getMessage().contains("holds domain \"media.sports\""), refused.getMessage());
    }
}
