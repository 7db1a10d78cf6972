package org.reliable.bench;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;

/**
 * The official Java client's bench cases against one RocketMQ 5 gRPC endpoint, one topic and one
 * consumer group, driven over stdin so that the bench reads this process's CPU around each case
 * and nothing else (start-up, JIT warm-up) lands in it.
 *
 * <pre>
 * java -jar reliable-bench.jar ENDPOINT TOPIC GROUP
 * </pre>
 *
 * <p>It starts a producer and a simple consumer, sends one message and receives it (route,
 * channel, settings), then prints {@code {"ready": true, ...}}. Each line on stdin is a command,
 * each answered with one JSON line on stdout ({@code {"error": "..."}} when it failed):
 *
 * <ul>
 *   <li>{@code warm E P}: E sends one at a time, P with a window of 100, and every one of
 *       them received and acked, untimed (the JIT compiles the paths the cases take);
 *   <li>{@code send N}: {@code Producer.send} one at a time, each call timed;
 *   <li>{@code send_async N W}: {@code Producer.sendAsync} with at most W unanswered;
 *   <li>{@code receive_ack N}: {@code SimpleConsumer.receive(32)} and {@code ackAsync} each,
 *       every ack confirmed before the clock stops;
 *   <li>{@code quit}.
 * </ul>
 *
 * <p>A case answers {@code count}, {@code seconds}, {@code thread_cpu_s} (the calling thread's
 * CPU) and, for {@code send}, {@code latencies_us}. Bodies are 1 KiB.
 */
public final class Bench {
    private static final byte[] BODY = new byte[1024];
    private static final int BATCH = 32;
    private static final Duration INVISIBLE = Duration.ofSeconds(30);
    private static final long STALL_S = 60;

    private final ClientServiceProvider provider = ClientServiceProvider.loadService();
    private final ThreadMXBean threads = ManagementFactory.getThreadMXBean();
    private final String topic;
    private final Producer producer;
    private final SimpleConsumer consumer;

    private Bench(String endpoint, String topic, String group) throws Exception {
        java.util.Arrays.fill(BODY, (byte) 'x');
        this.topic = topic;
        ClientConfiguration config = ClientConfiguration.newBuilder()
            .setEndpoints(endpoint)
            .enableSsl(false)
            .setRequestTimeout(Duration.ofSeconds(10))
            .build();
        this.producer = provider.newProducerBuilder()
            .setClientConfiguration(config)
            .setTopics(topic)
            .build();
        this.consumer = provider.newSimpleConsumerBuilder()
            .setClientConfiguration(config)
            .setConsumerGroup(group)
            .setAwaitDuration(Duration.ofSeconds(2))
            .setSubscriptionExpressions(
                Collections.singletonMap(topic, new FilterExpression("*", FilterExpressionType.TAG)))
            .build();
    }

    private Message message() {
        return provider.newMessageBuilder().setTopic(topic).setBody(BODY).build();
    }

    private long cpuNs() {
        return threads.getCurrentThreadCpuTime();
    }

    private String send(int n) throws Exception {
        long[] latencies = new long[n];
        long cpu = cpuNs();
        long start = System.nanoTime();
        for (int i = 0; i < n; i++) {
            long t = System.nanoTime();
            producer.send(message());
            latencies[i] = System.nanoTime() - t;
        }
        long elapsed = System.nanoTime() - start;
        StringBuilder out = result(n, elapsed, cpuNs() - cpu);
        out.setLength(out.length() - 1);
        out.append(", \"latencies_us\": [");
        for (int i = 0; i < n; i++) {
            out.append(i == 0 ? "" : ",").append(latencies[i] / 1000);
        }
        return out.append("]}").toString();
    }

    private String sendAsync(int n, int window) throws Exception {
        Semaphore slots = new Semaphore(window);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        long cpu = cpuNs();
        long start = System.nanoTime();
        for (int i = 0; i < n && failed.get() == null; i++) {
            if (!slots.tryAcquire(STALL_S, TimeUnit.SECONDS)) {
                throw new IllegalStateException("no send completed for " + STALL_S + " s");
            }
            producer.sendAsync(message()).whenComplete((receipt, error) -> {
                if (error != null) {
                    failed.compareAndSet(null, error);
                }
                slots.release();
            });
        }
        if (!slots.tryAcquire(window, STALL_S, TimeUnit.SECONDS)) {
            throw new IllegalStateException("sends still pending after " + STALL_S + " s");
        }
        long elapsed = System.nanoTime() - start;
        if (failed.get() != null) {
            throw new IllegalStateException("a pipelined send failed: " + failed.get());
        }
        return result(n, elapsed, cpuNs() - cpu).toString();
    }

    private String receiveAck(int n) throws Exception {
        List<CompletableFuture<Void>> acks = new ArrayList<>(n);
        long cpu = cpuNs();
        long start = System.nanoTime();
        int got = drain(n, acks);
        CompletableFuture.allOf(acks.toArray(new CompletableFuture[0])).get(STALL_S, TimeUnit.SECONDS);
        long elapsed = System.nanoTime() - start;
        return result(got, elapsed, cpuNs() - cpu).toString();
    }

    private int drain(int n, List<CompletableFuture<Void>> acks) throws Exception {
        int got = 0;
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(STALL_S);
        while (got < n) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("received " + got + " of " + n + ", then none for " + STALL_S + " s");
            }
            for (MessageView view : consumer.receive(BATCH, INVISIBLE)) {
                acks.add(consumer.ackAsync(view));
                got++;
                deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(STALL_S);
            }
        }
        return got;
    }

    private String warm(int each, int pipelined) throws Exception {
        send(each);
        sendAsync(pipelined, 100);
        List<CompletableFuture<Void>> acks = new ArrayList<>(each + pipelined);
        drain(each + pipelined, acks);
        CompletableFuture.allOf(acks.toArray(new CompletableFuture[0])).get(STALL_S, TimeUnit.SECONDS);
        return "{\"warmed\": " + (each + pipelined) + "}";
    }

    private static StringBuilder result(int count, long elapsedNs, long cpuNs) {
        return new StringBuilder()
            .append("{\"count\": ").append(count)
            .append(", \"seconds\": ").append(elapsedNs / 1e9)
            .append(", \"thread_cpu_s\": ").append(cpuNs / 1e9)
            .append("}");
    }

    private String command(String line) throws Exception {
        String[] words = line.trim().split("\\s+");
        switch (words[0]) {
            case "warm":
                return warm(Integer.parseInt(words[1]), Integer.parseInt(words[2]));
            case "send":
                return send(Integer.parseInt(words[1]));
            case "send_async":
                return sendAsync(Integer.parseInt(words[1]), Integer.parseInt(words[2]));
            case "receive_ack":
                return receiveAck(Integer.parseInt(words[1]));
            default:
                throw new IllegalArgumentException("unknown command " + words[0]);
        }
    }

    private static String quoted(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: java -jar reliable-bench.jar ENDPOINT TOPIC GROUP");
            System.exit(2);
        }
        Bench bench = new Bench(args[0], args[1], args[2]);
        bench.producer.send(bench.message());
        bench.drain(1, new ArrayList<>());
        System.out.println("{\"ready\": true, \"client\": \"rocketmq-client-java\"}");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null && !line.trim().equals("quit")) {
            if (line.isBlank()) {
                continue;
            }
            String answer;
            try {
                answer = bench.command(line);
            } catch (Exception e) {
                answer = "{\"error\": " + quoted(e.toString()) + "}";
            }
            System.out.println(answer);
            System.out.flush();
        }
        bench.producer.close();
        bench.consumer.close();
        // the client's non-daemon threads (schedulers, gRPC) would keep the JVM alive
        System.exit(0);
    }
}
