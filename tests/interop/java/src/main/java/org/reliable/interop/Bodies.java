package org.reliable.interop;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import java.util.zip.CRC32;

/**
 * The message bodies every scenario sends, the same in every interop program (README.md).
 *
 * <p>For z = 1..4, the first three bodies {@code crafted-<n>} (n = 0, 1, ...; none taken twice)
 * whose CRC32 is below 16^(8-z), i.e. whose 8-digit hex has at least z leading zeros: a digest
 * written as unpadded or padded hex differs for exactly these. Then {@code plain-<i>} repeated
 * i * 512 times, for i = 1..8 (bodies of 3 to 32 KiB).
 */
final class Bodies {
    static final int PER_LEVEL = 3;
    static final int LEVELS = 4;
    static final int PLAIN = 8;

    private Bodies() {
    }

    static long crc32(byte[] body) {
        CRC32 crc = new CRC32();
        crc.update(body, 0, body.length);
        return crc.getValue();
    }

    /** The CRC32 of {@code body} as 8 zero-padded hex digits. */
    static String crcHex(byte[] body) {
        return String.format("%08X", crc32(body));
    }

    static List<byte[]> all() {
        Set<Integer> taken = new LinkedHashSet<>();
        for (int z = 1; z <= LEVELS; z++) {
            long limit = 1L << (32 - 4 * z);
            int found = 0;
            for (int n = 0; found < PER_LEVEL; n++) {
                if (!taken.contains(n) && crc32(crafted(n)) < limit) {
                    taken.add(n);
                    found++;
                }
            }
        }
        List<byte[]> bodies = new ArrayList<>();
        for (int n : taken) {
            bodies.add(crafted(n));
        }
        for (int i = 1; i <= PLAIN; i++) {
            bodies.add(("plain-" + i).repeat(i * 512).getBytes(StandardCharsets.US_ASCII));
        }
        return bodies;
    }

    private static byte[] crafted(int n) {
        return ("crafted-" + n).getBytes(StandardCharsets.US_ASCII);
    }

    /** How many of {@code bodies} have a CRC32 whose 8-digit hex starts with 0. */
    static int leadingZeroCrc(List<byte[]> bodies) {
        int count = 0;
        for (byte[] body : bodies) {
            if (crcHex(body).startsWith("0")) {
                count++;
            }
        }
        return count;
    }
}
