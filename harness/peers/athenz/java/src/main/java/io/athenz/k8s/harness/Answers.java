package io.athenz.k8s.harness;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.yahoo.athenz.zts.ClientResourceError;
import com.yahoo.athenz.zts.ZTSClientException;

/** The answer shapes of the line protocol (see Main). */
final class Answers {
    private Answers() {}

    static ObjectNode status(int status, String message) {
        ObjectNode answer = JsonNodeFactory.instance.objectNode();
        answer.put("status", status);
        answer.put("message", message == null ? "" : message);
        return answer;
    }

    static ObjectNode success(int status, JsonNode decoded) {
        ObjectNode answer = status(status, "");
        answer.set("decoded", decoded);
        return answer;
    }

    /** ZTSClient's exception: its code, and the message of ZTS's error body when there was one. */
    static ObjectNode of(ZTSClientException e) {
        Object data = e.getData();
        String message =
                data instanceof ClientResourceError error ? error.message : unwrap(String.valueOf(data));
        return status(e.getCode(), message);
    }

    /**
     * Some ZTSClient methods (postRoleCertificateRequest) pass on the generated client's exception
     * message rather than its error body: "ClientResourceException (N): {code: N, message: "M"}",
     * ClientResourceError.toString's shape. M is ZTS's message.
     */
    static String unwrap(String data) {
        java.util.regex.Matcher m =
                java.util.regex.Pattern.compile(
                                "^ClientResourceException \\(\\d+\\): \\{code: \\d+, message: \"(.*)\"\\}$",
                                java.util.regex.Pattern.DOTALL)
                        .matcher(data);
        return m.matches() ? m.group(1) : data;
    }

    static ObjectNode unsendable(String why) {
        ObjectNode answer = JsonNodeFactory.instance.objectNode();
        answer.put("unsendable", why);
        return answer;
    }

    static ObjectNode error(String what) {
        ObjectNode answer = JsonNodeFactory.instance.objectNode();
        answer.put("error", what);
        return answer;
    }
}
