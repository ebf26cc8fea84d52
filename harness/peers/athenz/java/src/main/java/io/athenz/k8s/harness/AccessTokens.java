package io.athenz.k8s.harness;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.yahoo.athenz.auth.token.AccessToken;
import com.yahoo.athenz.auth.token.jwts.JwtsSigningKeyResolver;
import com.yahoo.athenz.auth.util.Crypto;
import com.yahoo.athenz.zts.AccessTokenResponse;
import com.yahoo.athenz.zts.ClientResourceError;
import com.yahoo.athenz.zts.ClientResourceException;
import com.yahoo.athenz.zts.ZTSRDLGeneratedClient;
import java.security.cert.X509Certificate;
import javax.net.ssl.SSLContext;
import org.apache.hc.client5.http.impl.classic.CloseableHttpClient;
import org.apache.hc.client5.http.impl.classic.HttpClients;
import org.apache.hc.client5.http.impl.io.PoolingHttpClientConnectionManagerBuilder;
import org.apache.hc.client5.http.ssl.DefaultClientTlsStrategy;

/**
 * The access token route with the exact form a row describes: through ZTS's generated client
 * (postAccessTokenRequest, which ZTSClient.getAccessToken calls with the form it builds), since the
 * rows include forms ZTSClient's builder would never make. A token is then verified by Athenz's
 * AccessToken class against ZTS's JWKS, bound to the caller's certificate (cnf x5t#S256).
 */
final class AccessTokens {
    private AccessTokens() {}

    static ObjectNode call(JsonNode request, String url, SSLContext tls) throws Exception {
        String contentType = Requests.optionalText(request, "content_type");
        if (!ZtsCalls.isForm(contentType)) {
            return Answers.unsendable(
                    "ZTS's clients always send the access token request as a form, never "
                            + contentType);
        }
        try (CloseableHttpClient http = httpClient(tls)) {
            ZTSRDLGeneratedClient client = new ZTSRDLGeneratedClient(url, http);
            AccessTokenResponse response;
            try {
                response = client.postAccessTokenRequest(Requests.text(request, "form"));
            } catch (ClientResourceException e) {
                Object data = e.getData();
                return Answers.status(
                        e.getCode(),
                        data instanceof ClientResourceError error ? error.message : "");
            }
            return Answers.success(200, verified(response, url, tls, Requests.file(request, "cert")));
        }
    }

    private static CloseableHttpClient httpClient(SSLContext tls) {
        return HttpClients.custom()
                .setConnectionManager(
                        PoolingHttpClientConnectionManagerBuilder.create()
                                .setTlsSocketStrategy(new DefaultClientTlsStrategy(tls))
                                .build())
                .build();
    }

    private static ObjectNode verified(
            AccessTokenResponse response, String url, SSLContext tls, String certPem) {
        ObjectNode decoded = JsonNodeFactory.instance.objectNode();
        decoded.put("token_type", response.getToken_type());
        decoded.put("expires_in", response.getExpires_in());
        // absent and empty are one to Go's model, so to both harnesses
        decoded.put("scope", response.getScope() == null ? "" : response.getScope());
        X509Certificate cert = Crypto.loadX509Certificate(certPem);
        JwtsSigningKeyResolver keys = new JwtsSigningKeyResolver(url + "/oauth2/keys?rfc=true", tls);
        AccessToken token = new AccessToken(response.getAccess_token(), keys, cert);
        decoded.put("client_id", token.getClientId());
        decoded.put("audience", token.getAudience());
        decoded.put("roles", String.join(",", token.getScope()));
        decoded.put("subject", token.getSubject());
        decoded.put("lifetimeSeconds", token.getExpiryTime() - token.getIssueTime());
        return decoded;
    }
}
