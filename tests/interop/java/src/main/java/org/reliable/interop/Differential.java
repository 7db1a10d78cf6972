package org.reliable.interop;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.zip.CRC32;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.StaticSessionCredentialsProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;

/**
 * The differential scenarios: what a server does with each kind of message and each kind of
 * mistake, reported as observations free of ids and times (codes, counts, attempt numbers,
 * delay buckets, property names and values, topic names), so that the reports of two servers
 * compare key by key (tests/interop/differential.py).
 *
 * <p>Topic and group of scenario S are {@code P-S}; the caller creates them beforehand with the
 * type each needs ({@link #TOPIC_TYPES}), and the groups {@code P-S} ({@code P-fifo} orderly,
 * {@code P-retry} with 2 retries) and {@code P-retry-dlq} (the dead letters' reader).
 */
final class Differential {
    static final List<String> NAMES = List.of(
        "normal", "fifo", "delay", "transaction", "invisible", "retry", "tag-filter",
        "large-body", "bad-topic", "bad-signature");
    /** The message type each scenario's topic is created with. */
    static final Map<String, String> TOPIC_TYPES = Map.of(
        "fifo", "FIFO", "delay", "DELAY", "transaction", "TRANSACTION");
    static final int MAX_BODY = 4 * 1024 * 1024;
    private static final Pattern CODE = Pattern.compile("response-code=(\\d+)");

    private final ClientServiceProvider provider = ClientServiceProvider.loadService();
    private final String endpoint;
    private final String name;
    private final String accessKey;
    private final String secretKey;
    private final int timeoutS;
    private final List<String> errors = Collections.synchronizedList(new ArrayList<>());

    Differential(String endpoint, String name, String accessKey, String secretKey, int timeoutS) {
        this.endpoint = endpoint;
        this.name = name;
        this.accessKey = accessKey;
        this.secretKey = secretKey;
        this.timeoutS = timeoutS;
    }

    Map<String, Object> run(String scenario) {
        long start = System.nanoTime();
        Map<String, Object> seen = new TreeMap<>();
        try {
            switch (scenario) {
                case "normal" -> normal(seen);
                case "fifo" -> fifo(seen);
                case "delay" -> delay(seen);
                case "transaction" -> transaction(seen);
                case "invisible" -> invisible(seen);
                case "retry" -> retry(seen);
                case "tag-filter" -> tagFilter(seen);
                case "large-body" -> largeBody(seen);
                case "bad-topic" -> badTopic(seen);
                case "bad-signature" -> badSignature(seen);
                default -> throw new IllegalArgumentException(scenario);
            }
        } catch (Exception e) {
            errors.add(outcome(e));
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("scenario", scenario);
        out.put("endpoint", endpoint);
        out.put("topic", name);
        out.put("observed", seen);
        out.put("errors", new ArrayList<>(errors));
        out.put("elapsed_ms", (System.nanoTime() - start) / 1_000_000);
        return out;
    }

    // -- the scenarios ---------------------------------------------------------------------

    /** Tag, keys and properties round-trip; one delivery each; the ack's outcome. */
    private void normal(Map<String, Object> seen) throws Exception {
        try (SimpleConsumer consumer = simpleConsumer(name, name, "*")) {
            Map<String, String> ids = new TreeMap<>();
            try (Producer producer = producer(config(secretKey), null)) {
                for (int i = 0; i < 3; i++) {
                    MessageBuilder b = message(name, "normal-" + i).setTag("tag-" + i)
                        .setKeys("key-" + i, "key-" + i + "-b")
                        .addProperty("prop", "value-" + i)
                        .addProperty("unicode", "é-" + i);
                    ids.put("normal-" + i, producer.send(b.build()).getMessageId().toString());
                }
            }
            List<MessageView> got = receiveUntil(consumer, 3, Duration.ofSeconds(30));
            List<Object> messages = new ArrayList<>();
            int sameId = 0;
            List<String> acks = new ArrayList<>();
            for (MessageView view : sorted(got)) {
                messages.add(describe(view));
                if (view.getMessageId().toString().equals(ids.get(body(view)))) {
                    sameId++;
                }
                acks.add(attempt(() -> consumer.ack(view)));
            }
            seen.put("messages", messages);
            seen.put("message_id_as_sent", sameId);
            seen.put("acks", acks);
        }
    }

    /** FIFO in two message groups to an orderly group's simple consumer, acked as received. */
    private void fifo(Map<String, Object> seen) throws Exception {
        try (SimpleConsumer consumer = simpleConsumer(name, name, "*")) {
            List<String> sent = new ArrayList<>();
            try (Producer producer = producer(config(secretKey), null)) {
                for (int i = 0; i < 6; i++) {
                    String group = "mg-" + (i % 2);
                    producer.send(message(name, group + "-" + i).setMessageGroup(group).build());
                    sent.add(group + "-" + i);
                }
            }
            Map<String, List<String>> order = new TreeMap<>();
            TreeSet<String> groups = new TreeSet<>();
            int maxBatchPerGroup = 0;
            long deadline = System.nanoTime() + timeoutS * 1_000_000_000L;
            int received = 0;
            while (received < sent.size() && System.nanoTime() < deadline) {
                Map<String, Integer> inBatch = new TreeMap<>();
                for (MessageView view : receive(consumer)) {
                    String group = view.getMessageGroup().orElse("(none)");
                    groups.add(group);
                    order.computeIfAbsent(group, k -> new ArrayList<>()).add(body(view));
                    inBatch.merge(group, 1, Integer::sum);
                    consumer.ack(view);
                    received++;
                }
                for (int n : inBatch.values()) {
                    maxBatchPerGroup = Math.max(maxBatchPerGroup, n);
                }
            }
            boolean inOrder = true;
            for (Map.Entry<String, List<String>> e : order.entrySet()) {
                List<String> want = new ArrayList<>();
                for (String s : sent) {
                    if (s.startsWith(e.getKey() + "-")) {
                        want.add(s);
                    }
                }
                inOrder &= e.getValue().equals(want);
            }
            seen.put("received", received);
            seen.put("message_groups", new ArrayList<>(groups));
            seen.put("in_order", inOrder);
        }
    }

    /** A message delivered 3 s after its send: how late it came, its delivery timestamp. */
    private void delay(Map<String, Object> seen) throws Exception {
        try (SimpleConsumer consumer = simpleConsumer(name, name, "*")) {
            long at;
            try (Producer producer = producer(config(secretKey), null)) {
                at = System.currentTimeMillis() + 3000;
                producer.send(message(name, "delay-0").setDeliveryTimestamp(at).build());
                seen.put("send_at_limit", attempt(() -> producer.send(message(name, "far")
                    .setDeliveryTimestamp(System.currentTimeMillis() + 86_400_000L + 60_000).build())));
            }
            List<MessageView> got = receiveUntil(consumer, 1, Duration.ofSeconds(30));
            long arrived = System.currentTimeMillis();
            seen.put("received", got.size());
            if (!got.isEmpty()) {
                MessageView view = got.get(0);
                seen.put("delivery_timestamp_as_sent", view.getDeliveryTimestamp().orElse(0L) == at);
                long late = arrived - at;
                seen.put("delivered", late < -300 ? "early" : late < 3000 ? "within 3 s" : "late");
                seen.put("message", describe(view));
                consumer.ack(view);
            }
        }
    }

    /** One committed and one rolled-back half message: only the committed one arrives. */
    private void transaction(Map<String, Object> seen) throws Exception {
        try (SimpleConsumer consumer = simpleConsumer(name, name, "*")) {
            try (Producer producer = producer(config(secretKey), view -> TransactionResolution.ROLLBACK)) {
                Transaction commit = producer.beginTransaction();
                producer.send(message(name, "commit").build(), commit);
                Transaction rollback = producer.beginTransaction();
                producer.send(message(name, "rollback").build(), rollback);
                seen.put("commit", attempt(commit::commit));
                seen.put("rollback", attempt(rollback::rollback));
                seen.put("commit_again", attempt(commit::commit));
                List<MessageView> got = receiveUntil(consumer, 1, Duration.ofSeconds(20));
                // a second look for the rolled-back one, which must never come
                got.addAll(receive(consumer));
                List<Object> messages = new ArrayList<>();
                for (MessageView view : sorted(got)) {
                    messages.add(describe(view));
                    consumer.ack(view);
                }
                seen.put("messages", messages);
            }
        }
    }

    /** Receive, make visible again in 1 s, receive the second delivery; ack old and new. */
    private void invisible(Map<String, Object> seen) throws Exception {
        try (SimpleConsumer consumer = simpleConsumer(name, name, "*")) {
            try (Producer producer = producer(config(secretKey), null)) {
                producer.send(message(name, "invisible-0").build());
            }
            List<MessageView> first = receiveUntil(consumer, 1, Duration.ofSeconds(20));
            seen.put("first_attempts", attempts(first));
            if (first.isEmpty()) {
                return;
            }
            MessageView view = first.get(0);
            seen.put("illegal_receive_invisible", attempt(() -> consumer.receive(1, Duration.ofSeconds(1))));
            seen.put("change", attempt(() -> consumer.changeInvisibleDuration(view, Duration.ofSeconds(1))));
            long changed = System.currentTimeMillis();
            List<MessageView> second = receiveUntil(consumer, 1, Duration.ofSeconds(20));
            long after = System.currentTimeMillis() - changed;
            seen.put("second_attempts", attempts(second));
            seen.put("second_within_s", after < 3000 ? "3" : after < 6000 ? "6" : "more");
            seen.put("ack_first_handle", attempt(() -> consumer.ack(view)));
            if (!second.isEmpty()) {
                seen.put("ack_second", attempt(() -> consumer.ack(second.get(0))));
                seen.put("ack_second_again", attempt(() -> consumer.ack(second.get(0))));
            }
        }
    }

    /**
     * A push consumer that fails every delivery of its group (2 retries, so 3 attempts): the
     * attempt numbers, the delays between them, then the dead-letter copy as a reader of
     * {@code %DLQ%<group>} (group {@code P-dlq}) receives it.
     */
    private void retry(Map<String, Object> seen) throws Exception {
        List<long[]> deliveries = Collections.synchronizedList(new ArrayList<>());
        long start = System.currentTimeMillis();
        try (PushConsumer consumer = provider.newPushConsumerBuilder()
            .setClientConfiguration(config(secretKey))
            .setConsumerGroup(name)
            .setSubscriptionExpressions(Map.of(name, new FilterExpression("*", FilterExpressionType.TAG)))
            .setMessageListener(view -> {
                deliveries.add(new long[] {view.getDeliveryAttempt(), System.currentTimeMillis()});
                return ConsumeResult.FAILURE;
            })
            .build()) {
            try (Producer producer = producer(config(secretKey), null)) {
                producer.send(message(name, "retry-0").setTag("retried").setKeys("retry-key")
                    .addProperty("prop", "kept").build());
            }
            long deadline = System.currentTimeMillis() + 30_000;
            while (deliveries.size() < 3 && System.currentTimeMillis() < deadline) {
                Thread.sleep(50);
            }
            Thread.sleep(3000); // a fourth delivery would be a mistake
        }
        List<Integer> attempts = new ArrayList<>();
        List<String> delays = new ArrayList<>();
        long previous = -1;
        for (long[] d : deliveries) {
            attempts.add((int) d[0]);
            if (previous >= 0) {
                delays.add(bucket(d[1] - previous));
            }
            previous = d[1];
        }
        seen.put("attempts", attempts);
        seen.put("delays", delays);
        String dlq = "%DLQ%" + name;
        long deadline = System.currentTimeMillis() + 30_000;
        List<MessageView> dead = new ArrayList<>();
        String lastFailure = null;
        while (dead.isEmpty() && System.currentTimeMillis() < deadline) {
            try (SimpleConsumer reader = simpleConsumer(name + "-dlq", dlq, "*")) {
                dead = receiveUntil(reader, 1, Duration.ofSeconds(20));
                for (MessageView view : dead) {
                    reader.ack(view);
                }
            } catch (Exception e) {
                lastFailure = outcome(e);
                Thread.sleep(1000);
            }
        }
        seen.put("dlq_messages", dead.size());
        if (dead.isEmpty()) {
            seen.put("dlq_reader", lastFailure);
        } else {
            seen.put("dlq_message", describe(dead.get(0)));
        }
        // from the last failed delivery, not the scenario's start: the dead letter follows
        // the last attempt at once (a further retry would wait 30 s), and client starts and
        // the ladder's own delays stretch with the machine's load
        long last = deliveries.isEmpty() ? start : deliveries.get(deliveries.size() - 1)[1];
        boolean soon = System.currentTimeMillis() - last < 20_000;
        seen.put("dlq_after_last_within_s", soon ? "20" : "more");
    }

    /** Tags A, B and C to a subscription "A || B". */
    private void tagFilter(Map<String, Object> seen) throws Exception {
        try (SimpleConsumer consumer = simpleConsumer(name, name, "A || B")) {
            try (Producer producer = producer(config(secretKey), null)) {
                for (String tag : List.of("C", "A", "B", "C")) {
                    producer.send(message(name, "tagged-" + tag).setTag(tag).build());
                }
            }
            List<MessageView> got = receiveUntil(consumer, 2, Duration.ofSeconds(20));
            got.addAll(receive(consumer));
            List<String> tags = new ArrayList<>();
            for (MessageView view : got) {
                tags.add(view.getTag().orElse("(none)"));
                consumer.ack(view);
            }
            Collections.sort(tags);
            seen.put("tags", tags);
        }
    }

    /** A body of exactly 4 MiB, and one byte more. */
    private void largeBody(Map<String, Object> seen) throws Exception {
        try (SimpleConsumer consumer = simpleConsumer(name, name, "*")) {
            byte[] body = new byte[MAX_BODY];
            for (int i = 0; i < body.length; i++) {
                body[i] = (byte) (i * 31 + (i >>> 11));
            }
            try (Producer producer = producer(config(secretKey), null)) {
                seen.put("send_4MiB", attempt(() -> producer.send(
                    provider.newMessageBuilder().setTopic(name).setBody(body).build())));
                byte[] more = Arrays.copyOf(body, MAX_BODY + 1);
                seen.put("send_4MiB_plus_1", attempt(() -> producer.send(
                    provider.newMessageBuilder().setTopic(name).setBody(more).build())));
            }
            List<MessageView> got = receiveUntil(consumer, 1, Duration.ofSeconds(30));
            seen.put("received", got.size());
            if (!got.isEmpty()) {
                ByteBuffer buffer = got.get(0).getBody();
                byte[] bytes = new byte[buffer.remaining()];
                buffer.get(bytes);
                seen.put("received_intact", Arrays.equals(bytes, body));
                consumer.ack(got.get(0));
            }
        }
    }

    /** A topic that does not exist: send, and a consumer subscribing to it. */
    private void badTopic(Map<String, Object> seen) throws Exception {
        String missing = name + "-missing";
        try (Producer producer = producer(config(secretKey), null)) {
            seen.put("send", attempt(() -> producer.send(message(missing, "lost").build())));
        }
        seen.put("simple_consumer", attempt(() -> simpleConsumer(name, missing, "*").close()));
        seen.put("send_wrong_type", attempt(() -> {
            try (Producer producer = producer(config(secretKey), null)) {
                producer.send(message(name, "typed").setMessageGroup("mg").build());
            }
        }));
    }

    /** A wrong secret, and no credentials at all. */
    private void badSignature(Map<String, Object> seen) throws Exception {
        seen.put("wrong_secret_send", attempt(() -> {
            try (Producer producer = producer(config(secretKey + "-wrong"), null)) {
                producer.send(message(name, "forged").build());
            }
        }));
        seen.put("no_credentials_send", attempt(() -> {
            try (Producer producer = producer(config(null), null)) {
                producer.send(message(name, "anonymous").build());
            }
        }));
        seen.put("right_secret_send", attempt(() -> {
            try (Producer producer = producer(config(secretKey), null)) {
                producer.send(message(name, "signed").build());
            }
        }));
    }

    // -- helpers ---------------------------------------------------------------------------

    interface Call {
        void run() throws Exception;
    }

    interface Returning {
        Object get() throws Exception;
    }

    private static String attempt(Call call) {
        try {
            call.run();
            return "OK";
        } catch (Exception e) {
            return outcome(e);
        }
    }

    private static String attempt(Returning call) {
        return attempt((Call) call::get);
    }

    /** An exception as its class and the server's code: {@code NotFoundException 40402}. */
    static String outcome(Throwable e) {
        while ((e instanceof ExecutionException || e.getClass() == RuntimeException.class)
            && e.getCause() != null) {
            e = e.getCause();
        }
        String message = String.valueOf(e.getMessage());
        Matcher m = CODE.matcher(message);
        if (m.find()) {
            return e.getClass().getSimpleName() + " " + m.group(1);
        }
        return e.getClass().getSimpleName();
    }

    private ClientConfiguration config(String secret) {
        var builder = ClientConfiguration.newBuilder()
            .setEndpoints(endpoint)
            .enableSsl(false)
            .setRequestTimeout(Duration.ofSeconds(5));
        if (accessKey != null && secret != null) {
            builder.setCredentialProvider(new StaticSessionCredentialsProvider(accessKey, secret));
        }
        return builder.build();
    }

    private Producer producer(ClientConfiguration config,
                              org.apache.rocketmq.client.apis.producer.TransactionChecker checker)
        throws Exception {
        var builder = provider.newProducerBuilder().setClientConfiguration(config).setMaxAttempts(1);
        if (checker != null) {
            builder.setTopics(name).setTransactionChecker(checker);
        }
        return builder.build();
    }

    private SimpleConsumer simpleConsumer(String group, String topic, String tags) throws Exception {
        return provider.newSimpleConsumerBuilder()
            .setClientConfiguration(config(secretKey))
            .setConsumerGroup(group)
            .setSubscriptionExpressions(Map.of(topic, new FilterExpression(tags, FilterExpressionType.TAG)))
            .setAwaitDuration(Duration.ofSeconds(5))
            .build();
    }

    private MessageBuilder message(String topic, String body) {
        return provider.newMessageBuilder().setTopic(topic)
            .setBody(body.getBytes(StandardCharsets.UTF_8));
    }

    private List<MessageView> receiveUntil(SimpleConsumer consumer, int count, Duration within)
        throws Exception {
        List<MessageView> got = new ArrayList<>();
        long deadline = System.nanoTime() + within.toNanos();
        while (got.size() < count && System.nanoTime() < deadline) {
            got.addAll(receive(consumer));
        }
        return got;
    }

    /** One receive, bounded: a server whose answer never ends is a receive that timed out. */
    private List<MessageView> receive(SimpleConsumer consumer) throws Exception {
        try {
            return consumer.receiveAsync(16, Duration.ofSeconds(20)).get(20, TimeUnit.SECONDS);
        } catch (TimeoutException e) {
            errors.add("receive: no answer within 20 s");
            return List.of();
        }
    }

    private static List<Integer> attempts(List<MessageView> views) {
        List<Integer> out = new ArrayList<>();
        for (MessageView view : views) {
            out.add(view.getDeliveryAttempt());
        }
        return out;
    }

    private static List<MessageView> sorted(List<MessageView> views) {
        List<MessageView> out = new ArrayList<>(views);
        out.sort((a, b) -> body(a).compareTo(body(b)));
        return out;
    }

    private static String body(MessageView view) {
        ByteBuffer buffer = view.getBody();
        byte[] bytes = new byte[buffer.remaining()];
        buffer.get(bytes);
        if (bytes.length > 64) {
            CRC32 crc = new CRC32();
            crc.update(bytes);
            return bytes.length + " bytes crc " + Long.toHexString(crc.getValue());
        }
        return new String(bytes, StandardCharsets.UTF_8);
    }

    /** What a delivered message says, without its ids and times. */
    private static Map<String, Object> describe(MessageView view) {
        Map<String, Object> out = new TreeMap<>();
        out.put("topic", view.getTopic());
        out.put("body", body(view));
        out.put("tag", view.getTag().orElse(null));
        out.put("keys", new ArrayList<>(new TreeSet<>(view.getKeys())));
        out.put("properties", new TreeMap<>(view.getProperties()));
        out.put("message_group", view.getMessageGroup().orElse(null));
        out.put("delivery_attempt", view.getDeliveryAttempt());
        Optional<Long> at = view.getDeliveryTimestamp();
        out.put("has_delivery_timestamp", at.isPresent());
        return out;
    }

    /** A delay between two deliveries, as the nearest step of the default retry ladder. */
    private static String bucket(long millis) {
        long[] steps = {1000, 5000, 10000, 30000, 60000};
        String[] names = {"1s", "5s", "10s", "30s", "1m"};
        int best = 0;
        for (int i = 1; i < steps.length; i++) {
            if (Math.abs(Math.log((double) Math.max(millis, 1) / steps[i]))
                < Math.abs(Math.log((double) Math.max(millis, 1) / steps[best]))) {
                best = i;
            }
        }
        return names[best];
    }
}
