package io.athenz.k8s.harness;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

/** Reading a request's fields, naming the one that is missing. */
final class Requests {
    private Requests() {}

    static String text(JsonNode request, String field) {
        JsonNode value = request.get(field);
        if (value == null || !value.isTextual()) {
            throw new IllegalArgumentException("request field '" + field + "' missing or not text");
        }
        return value.asText();
    }

    static String optionalText(JsonNode request, String field) {
        JsonNode value = request.get(field);
        return value == null || value.isNull() ? null : value.asText();
    }

    /** The contents of the file a field names, or null when the field is absent. */
    static String file(JsonNode request, String field) throws IOException {
        String path = optionalText(request, field);
        return path == null ? null : Files.readString(Path.of(path));
    }
}
