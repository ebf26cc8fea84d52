package io.athenz.k8s.harness;

import com.oath.auth.Utils;
import java.io.ByteArrayInputStream;
import java.nio.charset.StandardCharsets;
import java.security.KeyStore;
import java.security.SecureRandom;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/** SSLContexts as Athenz's services build them: with Athenz's cert-refresher utilities. */
final class Tls {
    /** ZTS's provider-client contexts, one per identity, kept for the process's life. */
    private static final Map<String, SSLContext> ZTS_CONTEXTS = new ConcurrentHashMap<>();

    private Tls() {}

    /**
     * The SSLContext ZTS gives every InstanceHttpProvider, as ZTSUtils.getAthenzServerSSLContext
     * makes it (key managers from ZTS's key, trust managers from its trust store,
     * SSLContext.getInstance("TLSv1.2")): made once for a given identity and then the same
     * object, as ZTSImpl makes it once at start-up, so its client session cache outlives each
     * confirmation's client.
     */
    static SSLContext ztsProviderContext(String caPem, String certPem, String keyPem) {
        return ZTS_CONTEXTS.computeIfAbsent(
                caPem + "\0" + certPem + "\0" + keyPem,
                identity -> {
                    try {
                        KeyStore trust =
                                Utils.generateTrustStore(
                                        new ByteArrayInputStream(
                                                caPem.getBytes(StandardCharsets.UTF_8)));
                        TrustManagerFactory factory =
                                TrustManagerFactory.getInstance(
                                        TrustManagerFactory.getDefaultAlgorithm());
                        factory.init(trust);
                        SSLContext context = SSLContext.getInstance("TLSv1.2");
                        context.init(
                                Utils.getKeyManagersFromPems(certPem, keyPem),
                                factory.getTrustManagers(),
                                new SecureRandom());
                        return context;
                    } catch (Exception e) {
                        throw new IllegalStateException("ZTS's SSLContext: " + e.getMessage(), e);
                    }
                });
    }

    /** Trusting only `caPem`, presenting `certPem`/`keyPem` when both are given. */
    static SSLContext context(String caPem, String certPem, String keyPem) throws Exception {
        if (certPem != null && keyPem != null) {
            return Utils.buildSSLContext(caPem, certPem, keyPem);
        }
        KeyStore trust =
                Utils.generateTrustStore(
                        new ByteArrayInputStream(caPem.getBytes(StandardCharsets.UTF_8)));
        TrustManagerFactory factory =
                TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        factory.init(trust);
        SSLContext context = SSLContext.getInstance("TLSv1.3");
        context.init(null, factory.getTrustManagers(), null);
        return context;
    }
}
