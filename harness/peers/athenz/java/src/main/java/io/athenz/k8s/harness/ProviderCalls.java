package io.athenz.k8s.harness;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.yahoo.athenz.instance.provider.InstanceConfirmation;
import com.yahoo.athenz.instance.provider.ProviderResourceException;
import com.yahoo.athenz.instance.provider.impl.InstanceHttpProvider;
import javax.net.ssl.SSLContext;

/**
 * ZTS calling an HTTP instance provider, as ZTSImpl does for each launch and refresh: a new
 * InstanceHttpProvider initialized with the provider's name and endpoint and ZTS's own
 * SSLContext (so Athenz's ProviderHostnameVerifier requires the provider's CN), then
 * confirmInstance or refreshInstance, then close. The SSLContext is ZTS's one
 * (Tls.ztsProviderContext): TLS 1.2, the same object for every call with the same identity, so a
 * new connection may resume an earlier one's session. A request's "read_timeout_ms" is ZTS's
 * athenz.instance.provider.client.read_timeout (30 s unset).
 */
final class ProviderCalls {
    private static final ObjectMapper JSON = new ObjectMapper();

    /** ZTS's setting for how long InstanceHttpProvider waits on a provider's answer (ms). */
    private static final String READ_TIMEOUT = "athenz.instance.provider.client.read_timeout";

    private ProviderCalls() {}

    static ObjectNode call(JsonNode request) throws Exception {
        SSLContext zts =
                Tls.ztsProviderContext(
                        Requests.file(request, "ca"),
                        Requests.file(request, "cert"),
                        Requests.file(request, "key"));
        InstanceConfirmation confirmation =
                JSON.treeToValue(request.get("confirmation"), InstanceConfirmation.class);
        JsonNode readTimeout = request.get("read_timeout_ms");
        if (readTimeout != null) {
            // how ZTS is configured: InstanceHttpProvider.initialize reads the system property
            System.setProperty(READ_TIMEOUT, Integer.toString(readTimeout.asInt()));
        }
        InstanceHttpProvider provider = new InstanceHttpProvider();
        provider.initialize(
                Requests.text(request, "provider"), Requests.text(request, "url"), zts, null);
        try {
            InstanceConfirmation confirmed =
                    Requests.text(request, "op").equals("provider_refresh")
                            ? provider.refreshInstance(confirmation)
                            : provider.confirmInstance(confirmation);
            return Answers.success(200, JSON.valueToTree(confirmed));
        } catch (ProviderResourceException e) {
            return Answers.status(e.getCode(), e.getMessage());
        } catch (RuntimeException e) {
            // a 200 whose body is no InstanceConfirmation: not a ProviderResourceException, so
            // ZTSImpl.validateConfirmationData's catch (Exception) makes it a 403
            return Answers.status(200, "the provider's confirmation is unreadable: " + e.getMessage());
        } finally {
            provider.close();
        }
    }
}
