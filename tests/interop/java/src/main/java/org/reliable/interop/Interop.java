package org.reliable.interop;

import java.io.InputStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;

/**
 * The official Java client against a RocketMQ 5 gRPC endpoint, one scenario at a time.
 *
 * <pre>
 * java -jar reliable-interop.jar ENDPOINT SCENARIO... [--prefix P] [--timeout-s S]
 *     [--access-key AK --secret-key SK]
 * </pre>
 *
 * <p>Each scenario uses the topic and the consumer group {@code P-SCENARIO} (P defaults to
 * {@code interop-java-<millis>}) and prints one JSON line of what it observed on stdout; progress
 * goes to stderr. The exit status is 0 when every scenario ran (whatever it observed), 2 on a
 * usage error. Scenarios: {@link Scenarios#NAMES}, and the differential ones,
 * {@link Differential#NAMES}, which sign their calls with the access key when one is given.
 */
public final class Interop {
    private Interop() {
    }

    public static void main(String[] args) throws Exception {
        List<String> positional = new ArrayList<>();
        String prefix = "interop-java-" + System.currentTimeMillis();
        int timeoutS = 30;
        String accessKey = null;
        String secretKey = null;
        Iterator<String> it = Arrays.asList(args).iterator();
        while (it.hasNext()) {
            String arg = it.next();
            if (arg.equals("--prefix") && it.hasNext()) {
                prefix = it.next();
            } else if (arg.equals("--timeout-s") && it.hasNext()) {
                timeoutS = Integer.parseInt(it.next());
            } else if (arg.equals("--access-key") && it.hasNext()) {
                accessKey = it.next();
            } else if (arg.equals("--secret-key") && it.hasNext()) {
                secretKey = it.next();
            } else if (arg.startsWith("--")) {
                usage("unknown option " + arg);
            } else {
                positional.add(arg);
            }
        }
        if (positional.size() < 2) {
            usage("an endpoint and at least one scenario are needed");
        }
        String endpoint = positional.get(0);
        List<String> scenarios = positional.subList(1, positional.size());
        for (String scenario : scenarios) {
            if (!Scenarios.NAMES.contains(scenario) && !Differential.NAMES.contains(scenario)) {
                usage("unknown scenario " + scenario);
            }
        }
        String version = clientVersion();
        for (String scenario : scenarios) {
            String name = prefix + "-" + scenario;
            System.err.printf("interop java: %s against %s%n", scenario, endpoint);
            Map<String, Object> outcome = Differential.NAMES.contains(scenario)
                ? new Differential(endpoint, name, accessKey, secretKey, timeoutS).run(scenario)
                : new Scenarios(endpoint, name, timeoutS).run(scenario);
            outcome.put("client", "java");
            outcome.put("client_version", version);
            System.out.println(Json.of(outcome));
            System.out.flush();
        }
        // the clients' non-daemon threads (schedulers, gRPC) would keep the JVM alive
        System.exit(0);
    }

    private static void usage(String problem) {
        System.err.println("interop java: " + problem);
        System.err.println("usage: java -jar reliable-interop.jar ENDPOINT SCENARIO... "
            + "[--prefix P] [--timeout-s S] [--access-key AK --secret-key SK]; scenarios: "
            + String.join(", ", Scenarios.NAMES) + ", " + String.join(", ", Differential.NAMES));
        System.exit(2);
    }

    /** The version of rocketmq-client-java in this jar, from its Maven metadata. */
    private static String clientVersion() {
        String path = "/META-INF/maven/org.apache.rocketmq/rocketmq-client-java/pom.properties";
        try (InputStream in = Interop.class.getResourceAsStream(path)) {
            if (in == null) {
                return "unknown";
            }
            Properties props = new Properties();
            props.load(in);
            return props.getProperty("version", "unknown");
        } catch (Exception e) {
            return "unknown";
        }
    }
}
