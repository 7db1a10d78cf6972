package org.reliable.interop;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.java.message.MessageViewImpl;

/**
 * The scenarios, each over its own topic and group (both named {@code name}).
 *
 * <ul>
 *   <li>{@code push}: a PushConsumer; every body sent reaches the listener (a body the client
 *   finds corrupted never does).</li>
 *   <li>{@code simple}: a SimpleConsumer receives and acks every body; none is corrupted.</li>
 *   <li>{@code fifo-push}: FIFO messages in three message groups to a PushConsumer of a FIFO
 *   group (created beforehand); every body reaches the listener in its group's order (a FIFO
 *   consumer sends a corrupted message to the dead-letter queue instead).</li>
 * </ul>
 */
final class Scenarios {
    static final List<String> NAMES = List.of("push", "simple", "fifo-push");
    private static final int MESSAGE_GROUPS = 3;

    private final ClientServiceProvider provider = ClientServiceProvider.loadService();
    private final ClientConfiguration config;
    private final String endpoint;
    private final String name;
    private final int timeoutS;
    private final List<byte[]> bodies = Bodies.all();
    private final Set<String> expected = ConcurrentHashMap.newKeySet();
    private final Set<String> sent = ConcurrentHashMap.newKeySet();
    private final Set<String> received = ConcurrentHashMap.newKeySet();
    private final Set<String> unexpected = ConcurrentHashMap.newKeySet();
    private final List<String> errors = Collections.synchronizedList(new ArrayList<>());
    private final AtomicInteger listenerCalls = new AtomicInteger();

    Scenarios(String endpoint, String name, int timeoutS) {
        this.endpoint = endpoint;
        this.name = name;
        this.timeoutS = timeoutS;
        this.config = ClientConfiguration.newBuilder()
            .setEndpoints(endpoint)
            .enableSsl(false)
            .setRequestTimeout(Duration.ofSeconds(5))
            .build();
        for (byte[] body : bodies) {
            expected.add(text(body));
        }
    }

    Map<String, Object> run(String scenario) {
        long start = System.nanoTime();
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("scenario", scenario);
        out.put("endpoint", endpoint);
        out.put("topic", name);
        out.put("group", name);
        try {
            switch (scenario) {
                case "push" -> push(out, false);
                case "fifo-push" -> push(out, true);
                case "simple" -> simple(out);
                default -> throw new IllegalArgumentException(scenario);
            }
        } catch (Exception e) {
            errors.add(e.toString());
        }
        List<String> missing = new ArrayList<>();
        for (String body : sent) {
            if (!received.contains(body)) {
                missing.add(label(body));
            }
        }
        out.put("sent", sent.size());
        out.put("leading_zero_crc", Bodies.leadingZeroCrc(bodies));
        out.put("received", received.size());
        out.put("missing", missing.size());
        out.put("missing_bodies", missing);
        out.put("unexpected", unexpected.size());
        List<String> distinct = new ArrayList<>(new LinkedHashSet<>(errors));
        out.put("error_count", errors.size());
        out.put("errors", distinct.subList(0, Math.min(5, distinct.size())));
        out.put("elapsed_ms", (System.nanoTime() - start) / 1_000_000);
        return out;
    }

    private void push(Map<String, Object> out, boolean fifo) throws Exception {
        Map<String, List<String>> order = new ConcurrentHashMap<>();
        Map<String, String> groupOf = new HashMap<>();
        try (PushConsumer consumer = provider.newPushConsumerBuilder()
            .setClientConfiguration(config)
            .setConsumerGroup(name)
            .setSubscriptionExpressions(subscription())
            .setMessageListener(view -> {
                listenerCalls.incrementAndGet();
                String body = record(view);
                view.getMessageGroup().ifPresent(
                    g -> order.computeIfAbsent(g, k -> Collections.synchronizedList(new ArrayList<>()))
                        .add(body));
                return ConsumeResult.SUCCESS;
            })
            .build()) {
            progress("push consumer started");
            List<String> sentOrder = send(fifo, groupOf);
            waitForAll();
            if (fifo) {
                int outOfOrder = 0;
                for (int g = 0; g < MESSAGE_GROUPS; g++) {
                    String group = "mg-" + g;
                    List<String> want = new ArrayList<>();
                    for (String body : sentOrder) {
                        if (group.equals(groupOf.get(body))) {
                            want.add(body);
                        }
                    }
                    List<String> seen = new ArrayList<>();
                    for (String body : order.getOrDefault(group, List.of())) {
                        if (!seen.contains(body)) {
                            seen.add(body);
                        }
                    }
                    if (!seen.equals(want.subList(0, Math.min(seen.size(), want.size())))) {
                        outOfOrder++;
                    }
                }
                out.put("out_of_order_groups", outOfOrder);
            }
        }
        out.put("listener_calls", listenerCalls.get());
    }

    private void simple(Map<String, Object> out) throws Exception {
        int corrupted = 0;
        int acked = 0;
        int ackErrors = 0;
        try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder()
            .setClientConfiguration(config)
            .setConsumerGroup(name)
            .setSubscriptionExpressions(subscription())
            .setAwaitDuration(Duration.ofSeconds(5))
            .build()) {
            progress("simple consumer started");
            send(false, new HashMap<>());
            long deadline = System.nanoTime() + timeoutS * 1_000_000_000L;
            while (!received.containsAll(sent) && System.nanoTime() < deadline) {
                for (MessageView view : consumer.receive(16, Duration.ofSeconds(15))) {
                    record(view);
                    if (view instanceof MessageViewImpl impl && impl.isCorrupted()) {
                        corrupted++;
                    }
                    try {
                        consumer.ack(view);
                        acked++;
                    } catch (Exception e) {
                        ackErrors++;
                        errors.add("ack: " + e);
                    }
                }
            }
        }
        out.put("corrupted", corrupted);
        out.put("acked", acked);
        out.put("ack_errors", ackErrors);
    }

    /** Sends every body (FIFO ones round-robin over the message groups); the bodies in order. */
    private List<String> send(boolean fifo, Map<String, String> groupOf) throws Exception {
        List<String> order = new ArrayList<>();
        try (Producer producer = provider.newProducerBuilder()
            .setClientConfiguration(config)
            .setTopics(name)
            .build()) {
            for (int i = 0; i < bodies.size(); i++) {
                byte[] body = bodies.get(i);
                MessageBuilder builder = provider.newMessageBuilder()
                    .setTopic(name)
                    .setTag("digest")
                    .setBody(body);
                String key = text(body);
                if (fifo) {
                    String group = "mg-" + (i % MESSAGE_GROUPS);
                    builder.setMessageGroup(group);
                    groupOf.put(key, group);
                }
                Message message = builder.build();
                try {
                    producer.send(message);
                    sent.add(key);
                    order.add(key);
                } catch (Exception e) {
                    errors.add("send: " + e);
                }
            }
        }
        progress("sent " + sent.size() + " messages");
        return order;
    }

    private void waitForAll() throws InterruptedException {
        long start = System.nanoTime();
        long deadline = start + timeoutS * 1_000_000_000L;
        while (!received.containsAll(sent) && System.nanoTime() < deadline) {
            Thread.sleep(50);
        }
        progress("received " + received.size() + " of " + sent.size() + " in "
            + (System.nanoTime() - start) / 1_000_000 + " ms");
    }

    private String record(MessageView view) {
        ByteBuffer buffer = view.getBody();
        byte[] bytes = new byte[buffer.remaining()];
        buffer.get(bytes);
        String body = text(bytes);
        if (expected.contains(body)) {
            received.add(body);
        } else {
            unexpected.add(label(body));
        }
        return body;
    }

    private Map<String, FilterExpression> subscription() {
        return Map.of(name, new FilterExpression("*", FilterExpressionType.TAG));
    }

    private static String text(byte[] body) {
        return new String(body, StandardCharsets.ISO_8859_1);
    }

    /** A short name for a body in the report: its start and its CRC32. */
    private static String label(String body) {
        byte[] bytes = body.getBytes(StandardCharsets.ISO_8859_1);
        String head = body.length() > 16 ? body.substring(0, 16) + "..." : body;
        return head + " crc=" + Bodies.crcHex(bytes);
    }

    private void progress(String what) {
        System.err.printf("interop java: %s: %s%n", name, what);
    }
}
