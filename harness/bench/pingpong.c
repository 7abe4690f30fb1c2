/* The bench's compiled ping-pong client (harness/bench/_compiled.py builds it with the
 * system's cc at bench time): so the RTT line's client costs ~1 us of CPU per round
 * trip, not the ~15 us a Python client does, which on one CPU hid the proxy's own cost.
 *
 *   pingpong HOST PORT COUNT WARMUP [pause | pace NS]
 *
 * Connects (TCP_NODELAY), sends the bench's echo-mode byte 'E', then WARMUP untimed and
 * COUNT timed 64-byte round trips, each checked byte for byte; prints each timed RTT in
 * ns, one a line. With "pause": prints "ready" after the warm-up and waits for a line
 * on stdin, then prints "done" after the timed ones and waits again (the callgrind line
 * dumps the proxy's counters at both points; the toxic lines remove a toxic there).
 * With "pace NS": open loop, one message every NS nanoseconds whatever came back (a
 * steady stream, as a client's heartbeat is), each numbered in its first 8 bytes, its
 * RTT from when it was sent to when its echo was read. Exit 1 on any failure, with why
 * on stderr.
 */
#define _GNU_SOURCE /* ppoll */
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int round_trip(int s, const char *msg, char *buf) {
    if (write(s, msg, 64) != 64)
        return -1;
    for (int got = 0; got < 64;) {
        ssize_t k = read(s, buf + got, 64 - got);
        if (k <= 0)
            return -1;
        got += (int)k;
    }
    return memcmp(buf, msg, 64) ? -2 : 0;
}

/* Open loop: message i leaves at start + i * interval; echoes are read as they come. */
static int paced(int s, long total, long long interval, long long *rtt) {
    long long *sent = malloc(sizeof(long long) * (size_t)total);
    char msg[64], buf[64];
    memset(msg, 'p', sizeof msg);
    long next = 0, got = 0, have = 0;
    long long start = now_ns(), limit = start + 60000000000LL + interval * total;
    while (got < total) {
        long long now = now_ns();
        if (now > limit) {
            fprintf(stderr, "pingpong: %ld of %ld paced echoes within the time allowed\n", got, total);
            return -1;
        }
        if (next < total && now >= start + next * interval) {
            memcpy(msg, &next, sizeof next);
            sent[next] = now_ns();
            if (write(s, msg, 64) != 64)
                return -1;
            next++;
            continue;
        }
        long long wait = next < total ? start + next * interval - now : 1000000000LL;
        struct timespec ts = {.tv_sec = wait / 1000000000LL, .tv_nsec = wait % 1000000000LL};
        struct pollfd pf = {.fd = s, .events = POLLIN};
        int n = ppoll(&pf, 1, &ts, NULL);
        if (n < 0)
            return -1;
        if (n == 0)
            continue;
        ssize_t k = read(s, buf + have, (size_t)(64 - have));
        if (k <= 0)
            return -1;
        have += k;
        if (have < 64)
            continue;
        long long t = now_ns();
        long seq;
        memcpy(&seq, buf, sizeof seq);
        memcpy(msg, &seq, sizeof seq);
        if (seq != got || memcmp(buf, msg, 64))
            return -2;
        rtt[got++] = t - sent[seq];
        have = 0;
    }
    free(sent);
    return 0;
}

static void wait_line(void) {
    char line[16];
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        exit(1);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: pingpong HOST PORT COUNT WARMUP [pause | pace NS]\n");
        return 2;
    }
    long count = atol(argv[3]), warmup = atol(argv[4]);
    int pause = argc > 5 && !strcmp(argv[5], "pause");
    long long pace = argc > 6 && !strcmp(argv[5], "pace") ? atoll(argv[6]) : 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
        fprintf(stderr, "pingpong: bad address %s\n", argv[1]);
        return 2;
    }
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct timeval tv = {.tv_sec = 60};
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0 || write(s, "E", 1) != 1) {
        perror("pingpong: connect");
        return 1;
    }
    char msg[64], buf[64];
    srand((unsigned)now_ns());
    for (int i = 0; i < 64; i++)
        msg[i] = (char)rand();
    long long *rtt = malloc(sizeof(long long) * (count ? count : 1));
    if (pace > 0) {
        long long *all = malloc(sizeof(long long) * (size_t)(warmup + count));
        int rc = paced(s, warmup + count, pace, all);
        if (rc) {
            fprintf(stderr, rc == -2 ? "pingpong: echo returned different bytes\n"
                                     : "pingpong: paced echo failed or closed\n");
            return 1;
        }
        for (long i = 0; i < count; i++)
            printf("%lld\n", all[warmup + i]);
        close(s);
        return 0;
    }
    for (long i = 0; i < warmup + count; i++) {
        if (pause && i == warmup) {
            printf("ready\n");
            wait_line();
        }
        long long t0 = now_ns();
        int rc = round_trip(s, msg, buf);
        if (rc) {
            fprintf(stderr, rc == -2 ? "pingpong: echo returned different bytes\n"
                                     : "pingpong: echo failed or closed\n");
            return 1;
        }
        if (i >= warmup)
            rtt[i - warmup] = now_ns() - t0;
    }
    if (pause) {
        printf("done\n");
        wait_line();
    }
    for (long i = 0; i < count; i++)
        printf("%lld\n", rtt[i]);
    close(s);
    return 0;
}
