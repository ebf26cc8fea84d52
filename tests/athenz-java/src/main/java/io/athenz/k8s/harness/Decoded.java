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
import java.security.cert.X509Certificate;

/**
 * What a success says once Athenz's code has read it: certificates parsed by Athenz's Crypto,
 * tokens by Athenz's token classes. A field the model could not fill fails here, naming it.
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

    /** A certificate PEM's CN, through Athenz's Crypto. */
    static String commonName(String field, String pem) {
        X509Certificate cert = Crypto.loadX509Certificate(required(field, pem));
        return Crypto.extractX509CertCommonName(cert);
    }

    static ObjectNode instanceIdentity(InstanceIdentity identity) {
        ObjectNode decoded = node();
        decoded.put("provider", required("provider", identity.getProvider()));
        decoded.put("name", required("name", identity.getName()));
        decoded.put("instanceId", required("instanceId", identity.getInstanceId()));
        decoded.put("certificateCn", commonName("x509Certificate", identity.getX509Certificate()));
        decoded.put(
                "signerCn",
                commonName("x509CertificateSigner", identity.getX509CertificateSigner()));
        return decoded;
    }

    static ObjectNode identity(Identity identity) {
        ObjectNode decoded = node();
        decoded.put("name", required("name", identity.getName()));
        decoded.put("certificateCn", commonName("certificate", identity.getCertificate()));
        decoded.put("caCertBundle", required("caCertBundle", identity.getCaCertBundle()).isEmpty() ? "absent" : "present");
        return decoded;
    }

    static ObjectNode roleToken(RoleToken token) {
        com.yahoo.athenz.auth.token.RoleToken parsed =
                new com.yahoo.athenz.auth.token.RoleToken(required("token", token.getToken()));
        ObjectNode decoded = node();
        decoded.put("domain", parsed.getDomain());
        decoded.put("principal", parsed.getPrincipal());
        decoded.put("roles", String.join(",", parsed.getRoles()));
        decoded.put("expiryTime", token.getExpiryTime());
        return decoded;
    }

    static ObjectNode roleCertificate(RoleCertificate certificate) {
        ObjectNode decoded = node();
        decoded.put(
                "certificateCn", commonName("x509Certificate", certificate.getX509Certificate()));
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
