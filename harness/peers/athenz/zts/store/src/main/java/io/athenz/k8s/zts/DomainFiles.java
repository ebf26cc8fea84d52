package io.athenz.k8s.zts;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.yahoo.athenz.zms.SignedDomain;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * The directory of domain files: one {@code <domain>.json} per domain. Shared by the store (which
 * reads signed domains) and the signer (which reads unsigned ones and writes signed ones), so the
 * two agree on names, sizes and what a bad file is.
 */
final class DomainFiles {

    /** Athenz's DomainName: dot-separated SimpleNames (core/zms's schema). */
    private static final Pattern DOMAIN_NAME =
            Pattern.compile("[a-zA-Z0-9_][a-zA-Z0-9_-]*(\\.[a-zA-Z0-9_][a-zA-Z0-9_-]*)*");
    /** A domain file larger than this is refused unread: far above any test domain, small for a heap. */
    static final long MAX_FILE_BYTES = 4L * 1024 * 1024;
    static final String SUFFIX = ".json";

    private DomainFiles() {
    }

    /**
     * The paths of {@code input}'s fields that did not survive reading into the model and writing
     * back ({@code back}): the fields the model does not define. An empty value the model leaves
     * out on writing is not counted.
     */
    static void fieldsLost(JsonNode input, JsonNode back, String path, List<String> lost) {
        if (input.isObject()) {
            input.properties().forEach(field -> {
                String at = path.isEmpty() ? field.getKey() : path + "." + field.getKey();
                JsonNode value = field.getValue();
                JsonNode kept = back == null ? null : back.get(field.getKey());
                if (kept == null || kept.isNull()) {
                    if (!isEmpty(value)) {
                        lost.add(at);
                    }
                } else {
                    fieldsLost(value, kept, at, lost);
                }
            });
        } else if (input.isArray() && back != null && back.isArray()) {
            for (int i = 0; i < input.size(); i++) {
                fieldsLost(input.get(i), back.get(i), path + "[" + i + "]", lost);
            }
        }
    }

    private static boolean isEmpty(JsonNode value) {
        return value.isNull() || (value.isContainerNode() && value.isEmpty())
                || (value.isTextual() && value.asText().isEmpty());
    }

    /** Whether {@code name} is a domain name; checked before the name becomes a path. */
    static boolean isDomainName(String name) {
        return name != null && name.length() <= 256 && DOMAIN_NAME.matcher(name).matches();
    }

    /** The file of {@code domain} in {@code dir}; the name is checked first. */
    static Path fileOf(Path dir, String domain) {
        if (!isDomainName(domain)) {
            throw new IllegalArgumentException("not a domain name: " + quote(domain));
        }
        return dir.resolve(domain + SUFFIX);
    }

    /** The domains {@code dir} holds files for, by file name; other files are ignored. */
    static List<String> domainsIn(Path dir) throws IOException {
        List<String> names = new ArrayList<>();
        try (Stream<Path> files = Files.list(dir)) {
            files.forEach(file -> {
                String name = file.getFileName().toString();
                if (name.endsWith(SUFFIX)) {
                    String domain = name.substring(0, name.length() - SUFFIX.length());
                    if (isDomainName(domain)) {
                        names.add(domain);
                    }
                }
            });
        }
        names.sort(null);
        return names;
    }

    /** The bytes of {@code file}, refused above {@link #MAX_FILE_BYTES} without reading on. */
    static byte[] read(Path file) throws IOException {
        try (InputStream in = Files.newInputStream(file)) {
            byte[] bytes = in.readNBytes((int) MAX_FILE_BYTES + 1);
            if (bytes.length > MAX_FILE_BYTES) {
                throw new IOException(file + " is larger than " + MAX_FILE_BYTES + " bytes");
            }
            return bytes;
        }
    }

    /** The signed domain in {@code dir} for {@code domain}, checked to be about that domain. */
    static SignedDomain readSigned(ObjectMapper mapper, Path dir, String domain) throws IOException {
        Path file = fileOf(dir, domain);
        SignedDomain signed = mapper.readValue(read(file), SignedDomain.class);
        if (signed.getDomain() == null || !domain.equals(signed.getDomain().getName())) {
            throw new IOException(file + " does not hold domain " + domain + " (its domain.name is "
                    + (signed.getDomain() == null ? "missing" : quote(signed.getDomain().getName())) + ")");
        }
        if (signed.getSignature() == null || signed.getSignature().isEmpty()) {
            throw new IOException(file + " is not signed (no signature)");
        }
        return signed;
    }

    static String quote(String s) {
        if (s == null) {
            return "null";
        }
        String shown = s.length() > 80 ? s.substring(0, 80) + "..." : s;
        return "\"" + shown.replaceAll("[^\\x20-\\x7e]", "?") + "\"";
    }
}
