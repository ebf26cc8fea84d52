package io.athenz.k8s.harness;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.yahoo.athenz.auth.util.Crypto;
import com.yahoo.athenz.zts.Identity;
import com.yahoo.athenz.zts.InstanceIdentity;
import com.yahoo.athenz.zts.JWK;
import com.yahoo.athenz.zts.JWKList;
import com.yahoo.athenz.zts.RoleCertificate;
import com.yahoo.athenz.zts.RoleToken;
import java.io.ByteArrayInputStream;
import java.nio.charset.StandardCharsets;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;

/**
 * What a success says once Athenz's code has read it: certificates parsed by Athenz's Crypto,
 * tokens by Athenz's token classes. A field the model could not fill fails here, naming it. The
 * fields and their names are the Go harness's too (harness/peers/athenz/go/calls.go), so a contract row
 * states one answer for both: lifetimes as whole minutes or seconds left, the signer as whether it
 * is the certificate's issuer.
 */
final class Decoded {
    private Decoded() {}

    private static ObjectNode node() {
        return JsonNodeFactory.instance.objectNode();
    }

    private static String required(String field, String value) {
        if (value == null || value.isEmpty()) {
            throw new IllegalStateException("the answer has no " + field);
        }
        return value;
    }

    /** The certificate's CN, minutes left, and whether the signer bundle holds its issuer. */
    private static void certificate(ObjectNode decoded, String field, String pem, String signers) {
        X509Certificate cert = Crypto.loadX509Certificate(required(field, pem));
        decoded.put("certificateCn", Crypto.extractX509CertCommonName(cert));
        decoded.put("expiresInMinutes", minutesLeft(cert));
        if (signers != null) {
            decoded.put("signerIsIssuer", signedByOneOf(cert, signers));
        }
    }

    /** Whole minutes until the certificate expires, rounded: its lifetime when just issued. */
    private static long minutesLeft(X509Certificate cert) {
        long millis = cert.getNotAfter().getTime() - System.currentTimeMillis();
        return Math.round(millis / 60_000.0);
    }

    /** Whether a certificate of the PEM bundle verifies the certificate's signature. */
    private static boolean signedByOneOf(X509Certificate cert, String bundle) {
        try {
            for (Certificate ca :
                    CertificateFactory.getInstance("X.509")
                            .generateCertificates(
                                    new ByteArrayInputStream(
                                            bundle.getBytes(StandardCharsets.US_ASCII)))) {
                try {
                    cert.verify(ca.getPublicKey());
                    return true;
                } catch (java.security.GeneralSecurityException notThisOne) {
                    // the next one
                }
            }
            return false;
        } catch (java.security.cert.CertificateException e) {
            throw new IllegalStateException("the signer bundle: " + e.getMessage(), e);
        }
    }

    static ObjectNode instanceIdentity(InstanceIdentity identity) {
        ObjectNode decoded = node();
        decoded.put("provider", required("provider", identity.getProvider()));
        decoded.put("name", required("name", identity.getName()));
        decoded.put("instanceId", required("instanceId", identity.getInstanceId()));
        certificate(
                decoded,
                "x509Certificate",
                identity.getX509Certificate(),
                required("x509CertificateSigner", identity.getX509CertificateSigner()));
        return decoded;
    }

    static ObjectNode identity(Identity identity) {
        ObjectNode decoded = node();
        decoded.put("name", required("name", identity.getName()));
        certificate(
                decoded,
                "certificate",
                identity.getCertificate(),
                required("caCertBundle", identity.getCaCertBundle()));
        return decoded;
    }

    static ObjectNode roleToken(RoleToken token) {
        com.yahoo.athenz.auth.token.RoleToken parsed =
                new com.yahoo.athenz.auth.token.RoleToken(required("token", token.getToken()));
        ObjectNode decoded = node();
        decoded.put("domain", parsed.getDomain());
        decoded.put("principal", parsed.getPrincipal());
        decoded.put("roles", String.join(",", parsed.getRoles()));
        decoded.put("lifetimeSeconds", parsed.getExpiryTime() - parsed.getTimestamp());
        if (token.getExpiryTime() != parsed.getExpiryTime()) {
            throw new IllegalStateException(
                    "expiryTime "
                            + token.getExpiryTime()
                            + " is not the token's "
                            + parsed.getExpiryTime());
        }
        return decoded;
    }

    static ObjectNode roleCertificate(RoleCertificate certificate) {
        ObjectNode decoded = node();
        certificate(decoded, "x509Certificate", certificate.getX509Certificate(), null);
        return decoded;
    }

    static ObjectNode jwks(JWKList list) {
        ObjectNode decoded = node();
        ArrayNode kids = decoded.putArray("kids");
        if (list.getKeys() == null || list.getKeys().isEmpty()) {
            throw new IllegalStateException("the JWKS has no keys");
        }
        for (JWK key : list.getKeys()) {
            kids.add(required("kid", key.getKid()) + ":" + required("kty", key.getKty()));
        }
        return decoded;
    }
}
