package io.athenz.k8s.harness;

import com.oath.auth.Utils;
import java.io.ByteArrayInputStream;
import java.nio.charset.StandardCharsets;
import java.security.KeyStore;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/** SSLContexts as Athenz's services build them: with Athenz's cert-refresher utilities. */
final class Tls {
    private Tls() {}

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
