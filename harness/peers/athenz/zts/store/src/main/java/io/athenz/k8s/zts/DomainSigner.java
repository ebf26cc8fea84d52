package io.athenz.k8s.zts;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.yahoo.athenz.auth.util.Crypto;
import com.yahoo.athenz.common.utils.SignUtils;
import com.yahoo.athenz.zms.DomainData;
import com.yahoo.athenz.zms.SignedDomain;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.FileTime;
import java.security.PrivateKey;
import java.util.ArrayList;
import java.util.List;

/**
 * Signs domain data as ZMS does: the signature over Athenz's canonical string of the domain
 * ({@code SignUtils.asCanonicalString}) with the ZMS private key, the key's id beside it; the
 * domain's policies signed the same way first, since they are part of the signed string.
 *
 * <p>Usage: {@code DomainSigner <zms-private-key.pem> <key-id> <in-dir> <out-dir>}: every
 * {@code <domain>.json} of in-dir (ZMS's DomainData, no field it does not define) becomes a
 * SignedDomain in out-dir, written to a temporary file and moved into place, so the store never
 * reads half a file, and stamped with the time after the move: a move keeps the temporary file's
 * older time, which a scan of the store begun between the write and the move would take as seen.
 * A bad file stops the run, named, before anything of it is written.
 */
public final class DomainSigner {

    private DomainSigner() {
    }

    public static void main(String[] args) {
        if (args.length != 4) {
            System.err.println("usage: DomainSigner <zms-private-key.pem> <key-id> <in-dir> <out-dir>");
            System.exit(2);
        }
        try {
            int signed = sign(Crypto.loadPrivateKey(new File(args[0])), args[1], Path.of(args[2]), Path.of(args[3]));
            System.out.println("DomainSigner: " + signed + " domains signed into " + args[3]);
        } catch (Exception ex) {
            System.err.println("DomainSigner: " + ex.getMessage());
            System.exit(1);
        }
    }

    static int sign(PrivateKey key, String keyId, Path in, Path out) throws IOException {
        ObjectMapper mapper = new ObjectMapper();
        Files.createDirectories(out);
        int count = 0;
        for (String domain : DomainFiles.domainsIn(in)) {
            Path file = DomainFiles.fileOf(in, domain);
            DomainData data;
            try {
                JsonNode input = mapper.readTree(DomainFiles.read(file));
                data = mapper.treeToValue(input, DomainData.class);
                // ZMS's model ignores fields it does not define; a typo must not vanish silently
                List<String> unknown = new ArrayList<>();
                DomainFiles.fieldsLost(input, mapper.valueToTree(data), "", unknown);
                if (!unknown.isEmpty()) {
                    throw new IOException("fields ZMS's DomainData does not define: " + String.join(", ", unknown));
                }
            } catch (IOException ex) {
                throw new IOException(file + ": " + ex.getMessage(), ex);
            }
            if (!domain.equals(data.getName())) {
                throw new IOException(file + " holds domain " + DomainFiles.quote(data.getName()));
            }
            // the policies carry their own signature, as ZMS signs them
            if (data.getPolicies() != null && data.getPolicies().getContents() != null) {
                data.getPolicies()
                        .setSignature(Crypto.sign(SignUtils.asCanonicalString(data.getPolicies().getContents()), key))
                        .setKeyId(keyId);
            }
            String signature = Crypto.sign(SignUtils.asCanonicalString(data), key);
            SignedDomain signedDomain = new SignedDomain().setDomain(data).setSignature(signature).setKeyId(keyId);
            Path target = DomainFiles.fileOf(out, domain);
            Path temporary = out.resolve("." + domain + ".tmp");
            Files.write(temporary, mapper.writeValueAsBytes(signedDomain));
            Files.move(temporary, target, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
            Files.setLastModifiedTime(target, FileTime.fromMillis(System.currentTimeMillis()));
            count++;
        }
        return count;
    }
}
