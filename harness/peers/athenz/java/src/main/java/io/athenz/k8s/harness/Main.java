package io.athenz.k8s.harness;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;

/**
 * Athenz's own Java clients, driven one request per line: a JSON request on stdin, a JSON answer on
 * stdout. The Rust tests (athenz_testbed::athenz_clients) build each request's material (CSRs,
 * certificates, tokens) and compare the answers with the contract; everything on the wire and
 * every decoding of an answer is Athenz's code (InstanceHttpProvider, ZTSClient, the ZTS model).
 *
 * <p>Answers: {"status": N, "message": "..."} for what the server said (message empty on success),
 * plus "decoded" on success: fields read back through Athenz's model classes; or {"unsendable":
 * "why"} when Athenz's client cannot express the request at all; or {"error": "..."} when the
 * harness itself failed.
 */
public final class Main {
    private static final int MAX_LINE = 1 << 20;

    private Main() {}

    public static void main(String[] args) throws Exception {
        ObjectMapper json = new ObjectMapper();
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        BufferedReader in =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            ObjectNode answer;
            if (line.length() > MAX_LINE) {
                answer = Answers.error("request longer than " + MAX_LINE + " characters");
            } else {
                answer = answer(json, line);
            }
            out.println(json.writeValueAsString(answer));
        }
    }

    private static ObjectNode answer(ObjectMapper json, String line) {
        try {
            JsonNode request = json.readTree(line);
            String op = Requests.text(request, "op");
            return switch (op) {
                case "provider_instance", "provider_refresh" -> ProviderCalls.call(request);
                case "register", "refresh", "key_refresh", "access_token", "role_token",
                        "role_cert", "jwks" -> ZtsCalls.call(request);
                default -> Answers.error("unknown op " + op);
            };
        } catch (Exception e) {
            return Answers.error(e.toString());
        }
    }
}
