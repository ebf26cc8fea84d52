package io.athenz.k8s.harness;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.yahoo.athenz.auth.impl.PrincipalAuthority;
import com.yahoo.athenz.zts.Identity;
import com.yahoo.athenz.zts.InstanceIdentity;
import com.yahoo.athenz.zts.InstanceRefreshInformation;
import com.yahoo.athenz.zts.InstanceRefreshRequest;
import com.yahoo.athenz.zts.InstanceRegisterInformation;
import com.yahoo.athenz.zts.JWKList;
import com.yahoo.athenz.zts.RoleCertificate;
import com.yahoo.athenz.zts.RoleCertificateRequest;
import com.yahoo.athenz.zts.RoleToken;
import com.yahoo.athenz.zts.ZTSClient;
import com.yahoo.athenz.zts.ZTSClientException;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import javax.net.ssl.SSLContext;

/**
 * One ZTS route through Athenz's ZTSClient: the request body is read into ZTS's own model class
 * (strictly: a field the model does not define makes the request unsendable, as it is for any
 * Athenz client), the client sends it, and a success is decoded by the model and by Decoded.
 */
final class ZtsCalls {
    /** Reads request bodies into the ZTS model. */
    private static final ObjectMapper MODEL = new ObjectMapper();

    private static final String FORM = "application/x-www-form-urlencoded";

    private ZtsCalls() {}

    static ObjectNode call(JsonNode request) throws Exception {
        String op = Requests.text(request, "op");
        String url = Requests.text(request, "url");
        String caPem = Requests.file(request, "ca");
        SSLContext tls = Tls.context(caPem, Requests.file(request, "cert"), Requests.file(request, "key"));
        try {
            return switch (op) {
                case "access_token" -> AccessTokens.call(request, url, tls);
                default -> withClient(op, request, url, tls);
            };
        } catch (ModelLacksField e) {
            return Answers.unsendable(e.getMessage());
        }
    }

    private static ObjectNode withClient(String op, JsonNode request, String url, SSLContext tls)
            throws Exception {
        ZTSClient client = new ZTSClient(url, tls);
        try {
            return switch (op) {
                case "register" -> register(client, request);
                case "refresh" -> refresh(client, request);
                case "key_refresh" -> keyRefresh(client, request);
                case "role_token" -> roleToken(client, request);
                case "role_cert" -> roleCert(client, request);
                case "jwks" -> jwks(client);
                default -> Answers.error("unknown op " + op);
            };
        } catch (ZTSClientException e) {
            return Answers.of(e);
        } finally {
            client.close();
        }
    }

    /**
     * The request body in ZTS's model. The model classes ignore unknown properties
     * (@JsonIgnoreProperties), so a field the model does not define would be dropped silently and
     * never reach ZTS: such a request is one Athenz's client cannot send.
     */
    private static <T> T body(JsonNode request, Class<T> model) throws Exception {
        JsonNode body = request.get("body");
        for (var names = body.fieldNames(); names.hasNext(); ) {
            String name = names.next();
            try {
                model.getField(name);
            } catch (NoSuchFieldException e) {
                throw new ModelLacksField(name);
            }
        }
        return MODEL.treeToValue(body, model);
    }

    /** A request field the ZTS model does not define. */
    static final class ModelLacksField extends Exception {
        private static final long serialVersionUID = 1L;

        ModelLacksField(String field) {
            super("the ZTS model has no field '" + field + "'");
        }
    }

    /** ZTSClient's register accepts only ZTS's 201; anything else is an exception. */
    private static ObjectNode register(ZTSClient client, JsonNode request) throws Exception {
        Map<String, List<String>> headers = new HashMap<>();
        InstanceIdentity identity =
                client.postInstanceRegisterInformation(
                        body(request, InstanceRegisterInformation.class), headers);
        ObjectNode decoded = Decoded.instanceIdentity(identity);
        decoded.put("location", headers.containsKey("location") ? "present" : "absent");
        return Answers.success(201, decoded);
    }

    private static ObjectNode refresh(ZTSClient client, JsonNode request) throws Exception {
        InstanceIdentity identity =
                client.postInstanceRefreshInformation(
                        Requests.text(request, "provider"),
                        Requests.text(request, "domain"),
                        Requests.text(request, "service"),
                        Requests.text(request, "instance_id"),
                        body(request, InstanceRefreshInformation.class));
        return Answers.success(200, Decoded.instanceIdentity(identity));
    }

    /** The key-based refresh, authenticated by an ntoken in Athenz's principal header. */
    private static ObjectNode keyRefresh(ZTSClient client, JsonNode request) throws Exception {
        client.addCredentials(new PrincipalAuthority().getHeader(), Requests.text(request, "ntoken"));
        Identity identity =
                client.postInstanceRefreshRequest(
                        Requests.text(request, "domain"),
                        Requests.text(request, "service"),
                        body(request, InstanceRefreshRequest.class));
        return Answers.success(200, Decoded.identity(identity));
    }

    private static ObjectNode roleToken(ZTSClient client, JsonNode request) throws Exception {
        RoleToken token =
                client.getRoleToken(
                        Requests.text(request, "domain"),
                        Requests.optionalText(request, "role"),
                        null,
                        null,
                        true);
        return Answers.success(200, Decoded.roleToken(token));
    }

    private static ObjectNode roleCert(ZTSClient client, JsonNode request) throws Exception {
        RoleCertificate certificate =
                client.postRoleCertificateRequest(body(request, RoleCertificateRequest.class));
        return Answers.success(200, Decoded.roleCertificate(certificate));
    }

    private static ObjectNode jwks(ZTSClient client) {
        JWKList keys = client.getJWKList(true);
        return Answers.success(200, Decoded.jwks(keys));
    }

    static boolean isForm(String contentType) {
        return contentType == null || contentType.equals(FORM);
    }
}
