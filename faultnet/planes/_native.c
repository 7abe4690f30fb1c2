/* faultnet.planes._native: the compiled forwarding core of the native data plane.
 *
 * The semantics are faultnet.planes.thread's, line for line where it matters (read its
 * theory of operation first); faultnet/planes/native.py is the Python face. What differs
 * is where the work runs:
 *
 * - One native thread (pthread) runs an edge-triggered epoll over every link's sockets
 *   (see rearm for what keeps it from missing bytes). It never takes the GIL and never
 *   touches a Python object: it reads and writes lanes, which are plain C structs, under
 *   the core's one mutex.
 * - Every operation called from Python that needs the mutex (add, freeze, thaw, end,
 *   counts, take, offer, offer_eof) takes it at once when it is free, and otherwise
 *   releases the GIL before waiting (add and settle always release it), so the
 *   forwarding thread is never waited for with the GIL held and a lock-order inversion
 *   cannot arise (the thread never waits for the GIL).
 * - Events go to an outbox under the mutex; the first one of a batch writes the notify
 *   eventfd, which a trio task waits readable on and then drains the batch with the GIL.
 * - The core holds a strong reference to each link it forwards (taken with the GIL in
 *   add). It cannot drop it without the GIL, so ending a link (whichever thread ends it)
 *   posts a RELEASE entry behind that link's last event, and drain() drops the
 *   reference, after the whole batch has been turned into Python objects.
 *
 * Two debug switches exist for the tests that prove the mutex matters (never set
 * otherwise): set_unlocked(True) makes freeze and counts skip the mutex (and settle, which
 * cannot run without it, do nothing) (the freeze
 * stress test goes red; set_widen(us) widens the race it opens, between a gate's look
 * and the syscall, so a bounded run sees it), and hold_write(fd) makes the thread stop, inside its next write
 * to fd (or just after the shutdown that forwards an EOF to fd) and with the mutex held,
 * until release_write() (freeze is seen to wait for it; a peer reads the FIN then).
 * set_edges_only(True) serves a socket only on an epoll edge, never from the again list
 * (bytes queued when a lane's turn ends stall: the test of that list goes red).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

/* Bytes per copied read; a read that fills it starts a splice burst (as thread.py). */
#define COPY_CHUNK (64 * 1024)
/* Bytes per splice; the pipe is asked to be as large. */
#define SPLICE_CHUNK (1024 * 1024)
/* Syscalls one socket may make per wake-up before the others get a turn. */
#define FAIR_OPS 16
/* Bytes a toxic lane's reader may run ahead of trio's chain (each chunk costing its
 * length plus CHUNK_COST, so a stream of tiny reads is bounded too). 1 MiB: what the
 * former bound of 16 chunks held at most (16 full 64 KiB reads), so no lane holds more
 * memory than before, while small messages are no longer cut off at 16 (64-byte
 * messages every 200 us through latency=5 ms are 25 chunks in flight: the reader stopped
 * at 16 and every later message waited in the socket, its read time late). Bulk through
 * latency L moves at most INBOX_BYTES per L (1 MiB / 5 ms: ~200 MB/s). */
#define INBOX_BYTES (1024 * 1024)
#define CHUNK_COST 64
/* A compiled latency stage holds what is in flight for its delay: a steady stream at
 * rate R through latency L has R x L bytes queued, so a bound of INBOX_BYTES caps it at
 * INBOX_BYTES / L (1 MiB / 5 ms: ~200 MB/s, 0.16x socat's here). The stage's bound is
 * (latency + jitter) x STAGE_RATE, at least INBOX_BYTES and at most STAGE_MAX_BYTES.
 * STAGE_RATE, 2 GB/s: above what one CPU here copies through a relay (socat's bulk
 * measured 1.2-1.7 GB/s), so up to STAGE_MAX_BYTES / STAGE_RATE (16 ms) of latency the
 * bound does not limit the rate below the machine's own; beyond it the stream moves at
 * most STAGE_MAX_BYTES per latency (32 MiB / 100 ms: 335 MB/s), as a TCP window would
 * limit it. Memory stays bounded in bytes: at most STAGE_MAX_BYTES (+ one read and its
 * CHUNK_COST) per lane. */
#define STAGE_RATE 2e9
#define STAGE_MAX_BYTES (32 * 1024 * 1024)
#define MAX_EVENTS 256
/* Idle pipes kept for the next burst. */
#define PIPE_KEEP 64
#define TCP_STATE_SYN_SENT 2
/* epoll data of the core's own descriptors (a link's sockets are their fds, >= 0). */
#define WAKE_ID (-1)
#define TIMER_ID (-2)

enum {
    EV_RESET,
    EV_DONE,
    EV_CHUNKS,
    EV_DRAINED,
    EV_ERROR,
    EV_UPSTREAM_FAILED,
    EV_RELEASE,
    EV_CLOSE /* a stage ends the connection (limit_data's limit reached): trio severs it */
};
enum { UP = 0, DOWN = 1 };

typedef struct chunk {
    struct chunk *next;
    double t; /* CLOCK_MONOTONIC seconds when the plane read it */
    size_t len;
    size_t off; /* bytes of it a compiled stage has written (bandwidth's pieces) */
    char data[];
} chunk;

typedef struct {
    int src, dst;
    int open;        /* the gate */
    uint64_t bytes;  /* written to dst: what crossed the proxy */
    char *held;      /* bytes read and not yet written (malloc'd), from held_off */
    size_t held_off, held_len;
    int pipe_r, pipe_w; /* the pipe lent for a burst (-1: none) */
    size_t piped;       /* bytes in that pipe */
    int burst, eof_read, eof_pending, eof_forwarded;
    /* An event said src's peer closed or failed (EPOLLRDHUP/HUP/ERR): read on past a
     * short read until the EOF or the error, which no later edge would announce. */
    int rdhup;
    int to_trio;
    chunk *inbox, *inbox_tail; /* chunks read for trio (len 0: the EOF) */
    size_t inbox_bytes;        /* their cost against INBOX_BYTES */
    int notified, waiting;
    /* A compiled stage (see release_due): the inbox is this thread's delay queue while
     * the lane is not to_trio. stage: STAGE_NONE (none: the plain path), STAGE_LATENCY
     * (lat_ms + a uniform draw of +- jit_ms), STAGE_BANDWIDTH (rate_kbps: pieces of at
     * most PIECE_SECONDS' worth, each due when the stream's virtual clock has
     * "transmitted" it), STAGE_SLICER (pieces of slice_avg +- a draw of slice_var bytes,
     * each due slice_delay after the one before was due: see release_due),
     * STAGE_PASS (bytes due at once: a pipeline of the two stages below alone),
     * STAGE_DROP (every byte dropped, the EOF held: the timeout toxic), STAGE_DRAIN
     * (what a removed stage queued leaves at once).
     * The pipeline: before the stage, limit_on (limit_data: the first limit bytes pass,
     * counted in count; then EV_CLOSE, and what follows is dropped without a draw);
     * after it, slow_on (slow_close: the EOF leaves slow_ms after it came to the head).
     * The one order limit > stage > slow_close serves a chain in any order: a
     * slow_close acts on the EOF only, after every byte before it, and a limit met
     * closes the connection (what follows it is never seen). */
    int stage;
    double lat_ms, jit_ms, rate_kbps;
    double clock;     /* bandwidth: when the last piece was due (0: idle, no credit) */
    size_t piece;     /* the bytes of the head chunk due at head_due */
    uint64_t draws;   /* the splitmix64 state (faultnet/toxics/draws.py: the same) */
    int limit_on, limit_closed; /* limit_data's stage; EV_CLOSE posted */
    long long limit;            /* limit_data: the bytes to pass */
    uint64_t count;             /* limit_data: the bytes passed (its state["sent"]) */
    int slow_on;                /* slow_close's stage */
    double slow_ms, eof_at;     /* slow_close: its delay; when the EOF came to the head */
    double head_due;  /* when the inbox's first chunk is due, once head_set */
    int head_set, head_drew;
    long long slice_avg, slice_var; /* slicer: bytes */
    double slice_delay;             /* slicer: seconds between two pieces' due times */
    double next_due;                /* slicer: when the next piece is due, once next_set */
    int next_set;
    int listed;       /* in the core's timed list */
    size_t bound;     /* the inbox's bound in bytes (INBOX_BYTES, or a stage's: stage_bound) */
} lane_t;

/* STAGE_DRAIN: no stage, but what the removed one queued still leaves (at once, in
 * order) before the lane is plain again; never set from Python. */
enum {
    STAGE_NONE = 0,
    STAGE_LATENCY = 1,
    STAGE_BANDWIDTH = 2,
    STAGE_DRAIN = 3,
    STAGE_SLICER = 4,
    STAGE_PASS = 5,
    STAGE_DROP = 6,
    STAGE_LAST = STAGE_DROP
};
/* The slicer's schedule restarts from now when it fell further behind than this
 * (faultnet/toxics/slicer.py's _MAX_LAG, where the figure is measured). */
#define SLICE_MAX_LAG 0.002
/* Bandwidth's pieces: at most this much transmission time each (as bandwidth.py). */
#define PIECE_SECONDS 0.1

struct CoreObject;

typedef struct {
    PyObject_HEAD
    struct CoreObject *core; /* set by add */
    lane_t lanes[2];
    int fds[2]; /* client, server */
    int mask[2];
    int connecting, ended, err, in_plane;
    int fail_next; /* debug: the next handling of this link meets a "bug" */
    double deadline;
    char errmsg[160];
} LinkObject;

typedef struct {
    LinkObject *link;
    int kind, lane;
} event_t;

typedef struct CoreObject {
    PyObject_HEAD
    pthread_mutex_t mu;
    int ep, wake, notify;
    int splice;
    int unlocked; /* debug: freeze and counts skip the mutex */
    int widen_us; /* debug: sleep this long between a gate's look and the syscall */
    int edges_only; /* debug: again_add does nothing (lanes stall: the test goes red) */
    LinkObject **byfd;
    int nbyfd;
    /* Sockets to service again without an epoll event (epoll is edge-triggered: see
     * rearm): a lane that stopped reading with bytes left (its FAIR_OPS turn ended).
     * again_on[fd] says fd is listed; room for 2 * nbyfd entries. */
    int *again;
    char *again_on;
    int nagain;
    event_t *outbox;
    int nout, capout;
    int scheduled;
    LinkObject **conn; /* links still connecting */
    int nconn, capconn;
    int pipes[PIPE_KEEP][2];
    int npipes;
    char *buf;
    /* Lanes with a staged inbox (release_due), and the timerfd armed at the earliest
     * due time among them (armed: that time, 0 disarmed): epoll_wait's own timeout has
     * millisecond steps, a timerfd the kernel's timer slack (set to 1 us for the thread). */
    struct timed { LinkObject *k; int li; } *timed;
    int ntimed, captimed;
    int tfd;
    double armed;
    pthread_t thread;
    int running, stopping;
    /* debug: hold the thread inside its next write to hold_fd */
    int hold_fd, hold_entered, hold_go;
    pthread_cond_t hold_cv;
    pthread_mutex_t hold_mu;
} CoreObject;

static PyTypeObject LinkType;
static PyTypeObject CoreType;

/* ---- helpers (mutex held, no GIL) ------------------------------------------------ */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A latency stage's inbox bound (see STAGE_RATE): what it holds in flight at that rate. */
static size_t stage_bound(double lat_ms, double jit_ms) {
    double ms = lat_ms + (jit_ms > 0 ? jit_ms : 0), want = STAGE_RATE * ms / 1000;
    if (!(want > INBOX_BYTES)) /* also NaN */
        return INBOX_BYTES;
    return want < STAGE_MAX_BYTES ? (size_t)want : STAGE_MAX_BYTES;
}

/* Chunks read on this lane go to its inbox: for trio, or for a compiled stage. */
static int queued(const lane_t *l) { return l->to_trio || l->stage; }

static int wants_read(const lane_t *l) {
    if (!l->open || l->eof_read || l->held || l->piped)
        return 0;
    return l->inbox_bytes < l->bound; /* 0 unless queued: the bound in bytes */
}

/* ---- the seeded generator (faultnet/toxics/draws.py is the same, bit for bit) ---- */

#define DRAW_GAMMA 0x9E3779B97F4A7C15ULL

static uint64_t draw64(uint64_t *state) {
    uint64_t z = (*state += DRAW_GAMMA);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Uniform in [a, b): a + (b - a) * u, u the draw's top 53 bits over 2^53. */
static double draw_uniform(uint64_t *state, double a, double b) {
    double u = (double)(draw64(state) >> 11) * (1.0 / 9007199254740992.0);
    return a + (b - a) * u;
}

/* Uniform integer in [lo, hi] (hi >= lo): lo + the draw modulo the range's size, as
 * Draws.integer (the modulo's bias is below 2^-40 for any slice size). */
static long long draw_int(uint64_t *state, long long lo, long long hi) {
    return lo + (long long)(draw64(state) % (uint64_t)(hi - lo + 1));
}

static int wants_write(const lane_t *l) { return l->open && (l->held || l->piped); }

/* An event's flags for *fd*: remember a peer's close or failure on the lane it feeds. */
static void note_hup(CoreObject *c, int fd, uint32_t events) {
    if (!(events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) || fd < 0 || fd >= c->nbyfd ||
        !c->byfd[fd])
        return;
    LinkObject *k = c->byfd[fd];
    k->lanes[fd == k->fds[0] ? 0 : 1].rdhup = 1;
}

/* Serve *fd* again on the next turn, without waiting for an event (see rearm). */
static void again_add(CoreObject *c, int fd) {
    if (c->edges_only || fd < 0 || fd >= c->nbyfd || c->again_on[fd])
        return;
    c->again_on[fd] = 1;
    c->again[c->nagain++] = fd;
}

static void post(CoreObject *c, LinkObject *k, int kind, int lane) {
    if (c->nout == c->capout) {
        int cap = c->capout ? c->capout * 2 : 64;
        event_t *grown = realloc(c->outbox, cap * sizeof(event_t));
        if (!grown)
            abort(); /* a reference would leak and an event be lost: no way on */
        c->outbox = grown;
        c->capout = cap;
    }
    c->outbox[c->nout].link = k;
    c->outbox[c->nout].kind = kind;
    c->outbox[c->nout].lane = lane;
    c->nout++;
    if (!c->scheduled) {
        uint64_t one = 1;
        c->scheduled = 1;
        if (write(c->notify, &one, sizeof one) < 0) {
            /* EAGAIN only (the counter is far from full): the trio side is woken already */
        }
    }
}

static void give_pipe(CoreObject *c, lane_t *l) {
    if (l->pipe_r < 0)
        return;
    if (c->npipes < PIPE_KEEP && !l->piped) {
        c->pipes[c->npipes][0] = l->pipe_r;
        c->pipes[c->npipes][1] = l->pipe_w;
        c->npipes++;
    } else { /* full, or it may still hold bytes (the link is torn down) */
        close(l->pipe_r);
        close(l->pipe_w);
    }
    l->pipe_r = l->pipe_w = -1;
    l->piped = 0;
}

static int take_pipe(CoreObject *c, lane_t *l) {
    int p[2];
    if (c->npipes) {
        c->npipes--;
        l->pipe_r = c->pipes[c->npipes][0];
        l->pipe_w = c->pipes[c->npipes][1];
        return 0;
    }
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0)
        return -1;
    (void)fcntl(p[1], F_SETPIPE_SZ, SPLICE_CHUNK); /* capped by pipe-max-size: keep default */
    l->pipe_r = p[0];
    l->pipe_w = p[1];
    return 0;
}

static void unlist_connecting(CoreObject *c, LinkObject *k) {
    for (int i = 0; i < c->nconn; i++) {
        if (c->conn[i] == k) {
            c->conn[i] = c->conn[--c->nconn];
            return;
        }
    }
}

/* List a lane with a staged inbox for run_timers. -1: out of memory. */
static int list_timed(CoreObject *c, LinkObject *k, int li) {
    if (k->lanes[li].listed)
        return 0;
    if (c->ntimed == c->captimed) {
        int cap = c->captimed ? c->captimed * 2 : 16;
        struct timed *grown = realloc(c->timed, cap * sizeof *grown);
        if (!grown)
            return -1;
        c->timed = grown;
        c->captimed = cap;
    }
    c->timed[c->ntimed].k = k;
    c->timed[c->ntimed].li = li;
    c->ntimed++;
    k->lanes[li].listed = 1;
    return 0;
}

/* The link leaves the timed list (its entries cleared: run_timers compacts them, and
 * may be iterating now). */
static void unlist_timed(CoreObject *c, LinkObject *k) {
    for (int i = 0; i < c->ntimed; i++)
        if (c->timed[i].k == k) {
            k->lanes[c->timed[i].li].listed = 0;
            c->timed[i].k = NULL;
        }
}

/* Take the link out of the plane; 0 if it had already ended. */
static int end_link(CoreObject *c, LinkObject *k) {
    if (k->ended)
        return 0;
    unlist_timed(c, k);
    __atomic_store_n(&k->ended, 1, __ATOMIC_RELEASE);
    for (int s = 0; s < 2; s++) {
        int fd = k->fds[s];
        if (k->mask[s] && c->ep >= 0)
            epoll_ctl(c->ep, EPOLL_CTL_DEL, fd, NULL);
        k->mask[s] = 0;
        if (fd >= 0 && fd < c->nbyfd && c->byfd[fd] == k)
            c->byfd[fd] = NULL;
        lane_t *l = &k->lanes[s];
        if (l->pipe_r >= 0) {
            close(l->pipe_r);
            close(l->pipe_w);
            l->pipe_r = l->pipe_w = -1;
            l->piped = 0;
        }
    }
    if (k->connecting)
        unlist_connecting(c, k);
    post(c, k, EV_RELEASE, -1);
    return 1;
}

static void fail(CoreObject *c, LinkObject *k, int lane, int err) {
    if (end_link(c, k)) {
        k->err = err ? err : ECONNRESET;
        post(c, k, EV_RESET, lane);
    }
}

/* A bug met on this link (an unexpected syscall failure): end it with ERROR. */
static void contain(CoreObject *c, LinkObject *k, const char *what, int err) {
    if (end_link(c, k)) {
        snprintf(k->errmsg, sizeof k->errmsg, "%s: %s", what, err ? strerror(err) : "failed");
        post(c, k, EV_ERROR, -1);
    }
}

/* Register what each socket of the link waits for. Edge-triggered: an event comes when
 * something new arrives (or space frees), not again while it stays so. That saves the
 * kernel a poll of every socket served by the last epoll_wait on the next one: measured
 * ~1 us of 25 us added per 64-byte round trip, all on one CPU (0.92x -> 0.88x socat's).
 * What level-triggering gave for free is kept two ways: a change of mask (EPOLL_CTL_MOD
 * or ADD) makes the kernel look at the socket's readiness again, and every path that
 * stops a lane before EAGAIN either changes its mask (held bytes, a full inbox, a
 * closed gate, the EOF) or lists its socket to be served again (again_add). */
static int rearm(CoreObject *c, LinkObject *k) {
    if (k->ended || c->ep < 0)
        return 0;
    for (int s = 0; s < 2; s++) {
        int fd = k->fds[s], mask;
        if (k->connecting) /* only the upstream socket, for its connect's outcome */
            mask = s == 1 ? EPOLLOUT : 0;
        else
            mask = (wants_read(&k->lanes[s]) ? EPOLLIN | EPOLLRDHUP : 0) |
                   (wants_write(&k->lanes[1 - s]) ? EPOLLOUT : 0);
        int old = k->mask[s];
        if (mask == old)
            continue;
        struct epoll_event ev = {.events = (uint32_t)mask | EPOLLET, .data.fd = fd};
        int op = !old ? EPOLL_CTL_ADD : !mask ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
        if (epoll_ctl(c->ep, op, fd, &ev) < 0) {
            contain(c, k, "epoll_ctl", errno);
            return -1;
        }
        k->mask[s] = mask;
    }
    return 0;
}

static void debug_hold(CoreObject *c, int fd) {
    if (fd != c->hold_fd)
        return;
    pthread_mutex_lock(&c->hold_mu);
    c->hold_fd = -1;
    c->hold_entered = 1;
    pthread_cond_broadcast(&c->hold_cv);
    while (!c->hold_go)
        pthread_cond_wait(&c->hold_cv, &c->hold_mu);
    pthread_mutex_unlock(&c->hold_mu);
}

static ssize_t lane_write(CoreObject *c, int fd, const char *p, size_t n) {
    debug_hold(c, fd);
    return write(fd, p, n);
}

static int maybe_eof(CoreObject *c, LinkObject *k, int li) {
    lane_t *l = &k->lanes[li];
    if (!l->eof_pending || l->held || l->piped || !l->open)
        return 0;
    /* The flag is set before the FIN can be seen: eof_forwarded() reads it without the
     * mutex, and a peer that has read the FIN must find it true. */
    __atomic_store_n(&l->eof_forwarded, 1, __ATOMIC_RELEASE);
    if (shutdown(l->dst, SHUT_WR) < 0 && errno != ENOTCONN) {
        __atomic_store_n(&l->eof_forwarded, 0, __ATOMIC_RELEASE); /* no FIN went out */
        fail(c, k, li, errno);
        return -1;
    }
    debug_hold(c, l->dst);
    l->eof_pending = 0;
    if (k->lanes[1 - li].eof_forwarded && end_link(c, k)) {
        post(c, k, EV_DONE, -1);
        return -1;
    }
    return 0;
}

/* Send n bytes at p (not held) to dst; hold what it does not take. -1: the link ended. */
static int send_fresh(CoreObject *c, LinkObject *k, int li, const char *p, size_t n) {
    lane_t *l = &k->lanes[li];
    ssize_t m = lane_write(c, l->dst, p, n);
    if (m < 0) {
        if (errno != EAGAIN) {
            fail(c, k, li, errno);
            return -1;
        }
        m = 0;
    }
    l->bytes += (uint64_t)m;
    if ((size_t)m < n) {
        l->held = malloc(n - m);
        if (!l->held) {
            contain(c, k, "malloc", ENOMEM);
            return -1;
        }
        memcpy(l->held, p + m, n - m);
        l->held_off = 0;
        l->held_len = n - m;
    }
    return 0;
}

/* The slicer's head piece: its size (l->piece, drawn as faultnet/toxics/slicer.py
 * draws it) and its due time: the chunk's read time, or the schedule's next_due if later
 * (with a delay), restarted from *now* if more than SLICE_MAX_LAG behind. */
static double slice_head(lane_t *l, const chunk *ch, double now) {
    double due = ch->t;
    if (l->slice_avg > 0) {
        long long size = l->slice_avg;
        if (l->slice_var > 0) {
            size += draw_int(&l->draws, -l->slice_var, l->slice_var);
            l->head_drew = 1;
            if (size < 1)
                size = 1;
        }
        if ((unsigned long long)size < l->piece)
            l->piece = (size_t)size;
    }
    if (l->next_set && l->slice_delay > 0) {
        if (l->next_due > due)
            due = l->next_due;
        if (due <= now && now - due > SLICE_MAX_LAG)
            due = now; /* too far behind to catch up: the schedule restarts */
    }
    return due;
}

/* A compiled stage's writer: the staged chunks due by *now* go out in order (gate open,
 * nothing held), the EOF (a chunk of length 0) after the last of them; the first not
 * yet due stays, its due time in head_due. A chunk's delay is drawn when it comes to
 * the head, as the Python toxic draws when the chunk's turn comes: the same generator
 * in the same order. A due time within 1 us counts as come (the timer's own slack and
 * the rounding to its nanoseconds). At most FAIR_OPS writes per call: a stage with
 * pieces due back to back (a slicer with delay 0 and size 1) yields the thread to the
 * other sockets, its head due in the past so that run_timers' timerfd fires at once.
 * -1: the link ended. */
static int release_due(CoreObject *c, LinkObject *k, int li, double now) {
    lane_t *l = &k->lanes[li];
    int ops = 0;
    while (!l->to_trio && l->inbox && l->open && !l->held && !l->piped) {
        chunk *ch = l->inbox;
        if (!ch->len && l->stage == STAGE_DROP)
            return 0; /* the timeout toxic holds the FIN: until the stage goes */
        if (!l->head_set) {
            double due = ch->t;
            l->head_drew = 0;
            l->piece = ch->len - ch->off;
            if (ch->len && l->limit_on) {
                long long left = l->limit - (long long)l->count;
                if (l->limit_closed || left <= 0)
                    l->piece = 0; /* dropped: no later stage sees it */
                else if ((unsigned long long)left < l->piece)
                    l->piece = (size_t)left;
            }
            if (ch->len && !l->piece) {
                /* dropped by the limit: due at once, nothing drawn */
            } else if (ch->len && l->stage == STAGE_LATENCY) {
                double ms = l->lat_ms;
                if (l->jit_ms > 0) {
                    ms += draw_uniform(&l->draws, -l->jit_ms, l->jit_ms);
                    l->head_drew = 1;
                }
                due += (ms > 0 ? ms : 0) / 1000;
            } else if (ch->len && l->stage == STAGE_SLICER) {
                due = slice_head(l, ch, now);
            } else if (ch->len && l->stage == STAGE_BANDWIDTH && l->rate_kbps > 0) {
                double bps = l->rate_kbps * 1000;
                size_t most = (size_t)(bps * PIECE_SECONDS);
                if (l->piece > (most ? most : 1))
                    l->piece = most ? most : 1;
                due = (l->clock > ch->t ? l->clock : ch->t) + (double)l->piece / bps;
            } else if (ch->len && l->stage == STAGE_DROP) {
                l->piece = 0;
            } else if (!ch->len && l->slow_on) {
                if (!l->eof_at) /* measured from when the FIN came here (an update keeps it) */
                    l->eof_at = now > ch->t ? now : ch->t;
                due = l->eof_at + (l->slow_ms > 0 ? l->slow_ms : 0) / 1000;
            } else {
                l->clock = 0; /* unlimited: no virtual clock runs */
            }
            l->head_due = due;
            l->head_set = 1;
        }
        if (l->head_due > now + 1e-6 || ops == FAIR_OPS)
            return 0; /* not due; or due, after this lane's turn (run_timers: at once) */
        l->head_set = 0;
        if (ch->len) {
            int r = l->piece ? send_fresh(c, k, li, ch->data + ch->off, l->piece) : 0;
            ops += l->piece != 0;
            ch->off += l->piece;
            if (l->limit_on) {
                l->count += l->piece;
                if (l->limit - (long long)l->count <= 0) { /* as limit_data.py: then close */
                    if (!l->limit_closed && r == 0)
                        post(c, k, EV_CLOSE, li);
                    l->limit_closed = 1;
                    ch->off = ch->len; /* the rest of the chunk is dropped */
                }
            }
            if (l->stage == STAGE_DROP)
                ch->off = ch->len;
            if (l->stage == STAGE_BANDWIDTH && l->rate_kbps > 0)
                l->clock = l->head_due;
            if (l->stage == STAGE_SLICER) {
                l->next_due = l->head_due + l->slice_delay;
                l->next_set = 1;
            }
            if (r < 0)
                return -1;
            if (ch->off < ch->len)
                continue; /* its next piece */
        }
        l->inbox = ch->next;
        if (!l->inbox) {
            l->inbox_tail = NULL;
            if (l->stage == STAGE_DRAIN)
                l->stage = STAGE_NONE; /* the plain fast path from here */
        }
        l->inbox_bytes -= ch->len + CHUNK_COST;
        if (!ch->len) {
            free(ch);
            l->eof_pending = 1;
            return maybe_eof(c, k, li);
        }
        free(ch);
    }
    return 0;
}

/* Release what is due on every listed lane, then arm the timerfd at the earliest due
 * time left (a lane frozen or holding bytes waits for thaw or EPOLLOUT instead). */
static void run_timers(CoreObject *c) {
    double now = now_s(), next = 0;
    int j = 0;
    for (int i = 0; i < c->ntimed; i++) {
        LinkObject *k = c->timed[i].k;
        if (!k)
            continue;
        lane_t *l = &k->lanes[c->timed[i].li];
        if (!l->to_trio && l->inbox && release_due(c, k, c->timed[i].li, now) == 0)
            rearm(c, k); /* reading may go on: the inbox is below its bound again */
        if (!c->timed[i].k) /* the link ended meanwhile */
            continue;
        if (l->to_trio || !l->inbox) {
            l->listed = 0;
            continue;
        }
        if (l->open && !l->held && !l->piped && l->head_set && (!next || l->head_due < next))
            next = l->head_due;
        c->timed[j++] = c->timed[i];
    }
    c->ntimed = j;
    if (next != c->armed && c->tfd >= 0) {
        struct itimerspec its;
        memset(&its, 0, sizeof its);
        if (next) {
            its.it_value.tv_sec = (time_t)next;
            its.it_value.tv_nsec = (long)((next - (double)(time_t)next) * 1e9);
            if (!its.it_value.tv_sec && !its.it_value.tv_nsec)
                its.it_value.tv_nsec = 1; /* 0 would disarm it */
        }
        (void)timerfd_settime(c->tfd, TFD_TIMER_ABSTIME, &its, NULL);
        c->armed = next;
    }
}

/* Write what the lane holds (gate open). -1: the link ended. */
static int flush(CoreObject *c, LinkObject *k, int li) {
    lane_t *l = &k->lanes[li];
    if (l->held) {
        ssize_t m = lane_write(c, l->dst, l->held + l->held_off, l->held_len - l->held_off);
        if (m < 0) {
            if (errno != EAGAIN) {
                fail(c, k, li, errno);
                return -1;
            }
            m = 0;
        }
        l->bytes += (uint64_t)m;
        l->held_off += (size_t)m;
        if (l->held_off == l->held_len) {
            free(l->held);
            l->held = NULL;
        }
    } else if (l->piped) {
        debug_hold(c, l->dst);
        ssize_t m = splice(l->pipe_r, NULL, l->dst, NULL, l->piped,
                           SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (m < 0) {
            if (errno == EAGAIN)
                return 0;
            fail(c, k, li, errno);
            return -1;
        }
        l->bytes += (uint64_t)m;
        l->piped -= (size_t)m;
        if (!l->piped)
            give_pipe(c, l);
    }
    if (!l->held && !l->piped) {
        if (l->to_trio && l->waiting) {
            l->waiting = 0;
            post(c, k, EV_DRAINED, li);
        }
        if (!l->to_trio && l->inbox) /* a stage's queue: on with what is due */
            return release_due(c, k, li, now_s());
        return maybe_eof(c, k, li);
    }
    return 0;
}

static void upstream_failed(CoreObject *c, LinkObject *k, int err) {
    if (end_link(c, k)) {
        k->err = err;
        post(c, k, EV_UPSTREAM_FAILED, -1);
    }
}

/* The n bytes just read into the buffer (0: the EOF), for trio's toxic chain. 1 if the
 * socket may have more to read now, 0 if not, -1 if the link ended. */
static int for_trio(CoreObject *c, LinkObject *k, int li, size_t n) {
    lane_t *l = &k->lanes[li];
    chunk *ch = malloc(sizeof(chunk) + n);
    if (!ch) {
        contain(c, k, "malloc", ENOMEM);
        return -1;
    }
    ch->next = NULL;
    ch->t = now_s(); /* the read just returned: the latency toxic counts from here */
    ch->len = n;
    ch->off = 0;
    memcpy(ch->data, c->buf, n);
    if (l->inbox_tail)
        l->inbox_tail->next = ch;
    else
        l->inbox = ch;
    l->inbox_tail = ch;
    l->inbox_bytes += n + CHUNK_COST;
    if (!n)
        l->eof_read = 1;
    if (!l->to_trio) { /* a compiled stage's: what is due now goes now, the rest waits */
        if (release_due(c, k, li, ch->t) < 0)
            return -1;
        if (l->inbox && list_timed(c, k, li) < 0) {
            contain(c, k, "realloc", ENOMEM);
            return -1;
        }
        if (l->held)
            return 0;
    } else if (!l->notified) {
        l->notified = 1;
        post(c, k, EV_CHUNKS, li);
    }
    if (!n)
        return 0;
    return (n == COPY_CHUNK || l->rdhup) && l->inbox_bytes < l->bound;
}

/* Pass on the n bytes just read into the buffer (0: the EOF). As for_trio. */
static int took(CoreObject *c, LinkObject *k, int li, size_t n) {
    lane_t *l = &k->lanes[li];
    if (!n) {
        l->eof_read = l->eof_pending = 1;
        return maybe_eof(c, k, li) < 0 ? -1 : 0;
    }
    if (send_fresh(c, k, li, c->buf, n) < 0)
        return -1;
    if (l->held || (n < COPY_CHUNK && !l->rdhup))
        return 0; /* held: wait for EPOLLOUT; short: the socket is almost surely empty */
    l->burst = c->splice;
    return 1;
}

/* One splice in and out: 1 while the burst goes on, 0 when it stops, -1: ended. */
static int splice_once(CoreObject *c, LinkObject *k, int li) {
    lane_t *l = &k->lanes[li];
    if (l->pipe_r < 0 && take_pipe(c, l) < 0) {
        l->burst = 0; /* out of descriptors: copy instead */
        return 1;
    }
    ssize_t n = splice(l->src, NULL, l->pipe_w, NULL, SPLICE_CHUNK,
                       SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n < 0) {
        if (errno != EAGAIN) {
            fail(c, k, li, errno);
            return -1;
        }
    }
    if (n <= 0) {
        give_pipe(c, l);
        l->burst = 0;
        if (n == 0) {
            l->eof_read = l->eof_pending = 1;
            return maybe_eof(c, k, li) < 0 ? -1 : 0;
        }
        return 0;
    }
    l->piped = (size_t)n;
    if (flush(c, k, li) < 0)
        return -1;
    if (l->piped)
        return 0; /* dst is full: wait for EPOLLOUT */
    if (n < SPLICE_CHUNK) {
        /* Short: the socket is most likely empty, but a pipe fills by its slots too
         * (small segments), so bytes may be left that no edge will announce. */
        l->burst = 0;
        again_add(c, l->src);
        return 0;
    }
    return 1;
}

/* Move what src has (gate open, nothing held). -1: the link ended. */
static int read_lane(CoreObject *c, LinkObject *k, int li) {
    lane_t *l = &k->lanes[li];
    for (int i = 0; i < FAIR_OPS; i++) {
        int more;
        if (c->widen_us)
            usleep(c->widen_us);
        if (l->burst && !queued(l)) {
            more = splice_once(c, k, li);
        } else {
            ssize_t n = read(l->src, c->buf, COPY_CHUNK);
            if (n < 0) {
                if (errno == EAGAIN)
                    return 0;
                fail(c, k, li, errno);
                return -1;
            }
            more = queued(l) ? for_trio(c, k, li, (size_t)n) : took(c, k, li, (size_t)n);
        }
        if (more <= 0)
            return more;
    }
    again_add(c, l->src); /* its turn is over, not its bytes: no edge will say so */
    return 0;
}

static void service(CoreObject *c, int fd);

static void connected(CoreObject *c, LinkObject *k) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(k->fds[1], SOL_SOCKET, SO_ERROR, &err, &len) < 0)
        err = errno ? errno : EBADF;
    if (err) {
        upstream_failed(c, k, err);
        return;
    }
    unlist_connecting(c, k);
    __atomic_store_n(&k->connecting, 0, __ATOMIC_RELEASE);
    service(c, k->fds[0]);
    rearm(c, k);
}

/* One ready socket, in general: its connect's outcome, held bytes to write, then what
 * to read. */
static void handle(CoreObject *c, LinkObject *k, int s) {
    if (k->fail_next) {
        k->fail_next = 0;
        contain(c, k, "a bug in the forwarding core (injected)", 0);
        return;
    }
    if (k->connecting) {
        connected(c, k);
        return;
    }
    if (wants_write(&k->lanes[1 - s]) && flush(c, k, 1 - s) < 0)
        return;
    if (!k->ended && wants_read(&k->lanes[s]) && read_lane(c, k, s) < 0)
        return;
    rearm(c, k);
}

static void service(CoreObject *c, int fd) {
    if (fd < 0 || fd >= c->nbyfd || !c->byfd[fd])
        return;
    LinkObject *k = c->byfd[fd];
    handle(c, k, fd == k->fds[0] ? 0 : 1);
}

/* Serve the sockets listed by again_add before this call; those listed meanwhile wait
 * for the next. An fd whose link ended meanwhile is no one's (service skips it) or a
 * newer link's, which a turn cannot harm. */
static void service_again(CoreObject *c) {
    int n = c->nagain;
    for (int i = 0; i < n; i++) {
        int fd = c->again[i];
        c->again_on[fd] = 0;
        service(c, fd);
    }
    if (c->nagain > n) /* never with none: memmove of NULL is undefined, even of 0 bytes */
        memmove(c->again, c->again + n, (size_t)(c->nagain - n) * sizeof *c->again);
    c->nagain -= n;
}

/* The common case, inlined: a small read written at once, nothing held either way. */
static void ready(CoreObject *c, int fd) {
    if (fd < 0 || fd >= c->nbyfd || !c->byfd[fd])
        return;
    LinkObject *k = c->byfd[fd];
    int s = fd == k->fds[0] ? 0 : 1;
    lane_t *r = &k->lanes[s], *w = &k->lanes[1 - s];
    if (!(r->open && !r->held && !w->held && !r->piped && !w->piped && !r->eof_read &&
          !queued(r) && !r->burst && !r->rdhup && !k->connecting && !k->fail_next)) {
        handle(c, k, s);
        return;
    }
    if (c->widen_us)
        usleep(c->widen_us);
    ssize_t n = read(r->src, c->buf, COPY_CHUNK);
    if (n < 0) {
        if (errno != EAGAIN)
            fail(c, k, s, errno);
        return;
    }
    if (n == 0 || n == COPY_CHUNK) { /* an EOF or a full buffer */
        int more = took(c, k, s, (size_t)n);
        if (more < 0)
            return;
        if (!k->ended && wants_read(r) && read_lane(c, k, s) < 0)
            return;
        rearm(c, k);
        return;
    }
    ssize_t m = lane_write(c, r->dst, c->buf, (size_t)n);
    if (m < 0) {
        if (errno != EAGAIN) {
            fail(c, k, s, errno);
            return;
        }
        m = 0;
    }
    r->bytes += (uint64_t)m;
    if (m != n) {
        r->held = malloc((size_t)(n - m));
        if (!r->held) {
            contain(c, k, "malloc", ENOMEM);
            return;
        }
        memcpy(r->held, c->buf + m, (size_t)(n - m));
        r->held_off = 0;
        r->held_len = (size_t)(n - m);
        rearm(c, k);
    }
}

/* End the links whose connect is past its deadline; ms until the next one (-1: none). */
static int expire(CoreObject *c) {
    double now = now_s(), next = -1;
    for (int i = 0; i < c->nconn;) {
        LinkObject *k = c->conn[i];
        if (k->deadline <= now) {
            upstream_failed(c, k, ETIMEDOUT); /* unlists it */
            continue;
        }
        if (next < 0 || k->deadline < next)
            next = k->deadline;
        i++;
    }
    if (next < 0)
        return -1;
    return (int)((next - now) * 1000) + 1;
}

static void *run(void *arg) {
    CoreObject *c = arg;
    struct epoll_event evs[MAX_EVENTS];
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the Python main thread's */
    /* A timer of this thread (the stages' timerfd) fires within 1 us of its time, not
     * the default 50 us slack. */
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    int timeout = -1;
    for (;;) {
        int n = epoll_wait(c->ep, evs, MAX_EVENTS, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return NULL; /* EBADF and the like: the core is broken beyond a link */
        }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd < 0) { /* the core's own: one test per event for both */
                uint64_t v;
                if (read(fd == WAKE_ID ? c->wake : c->tfd, &v, sizeof v) < 0) {
                    /* EAGAIN: another wake-up took it, or the timer was re-armed */
                }
                /* The flag after the read: core_join sets it, then writes, so a stop
                 * this look misses wrote after the read and the wait wakes again. The
                 * other order lost a stop that came between the look and the read (the
                 * thread plane's twin hung a join under stress-ng). */
                if (fd == WAKE_ID && __atomic_load_n(&c->stopping, __ATOMIC_SEQ_CST))
                    return NULL;
                if (fd == TIMER_ID) {
                    pthread_mutex_lock(&c->mu);
                    c->armed = 0; /* fired: run_timers arms it again, even for the same time */
                    pthread_mutex_unlock(&c->mu);
                }
                continue;
            }
            pthread_mutex_lock(&c->mu);
            note_hup(c, fd, evs[i].events);
            ready(c, fd);
            pthread_mutex_unlock(&c->mu);
        }
        timeout = -1;
        pthread_mutex_lock(&c->mu);
        if (c->nagain)
            service_again(c);
        if (c->ntimed) /* armed implies listed lanes: run_timers disarms when none are */
            run_timers(c);
        if (c->nconn)
            timeout = expire(c);
        if (c->nagain)
            timeout = 0; /* bytes are waiting: look for events, do not sleep */
        pthread_mutex_unlock(&c->mu);
    }
}

/* ---- locking from Python: the GIL released first ------------------------------------ */

/* Uncontended (the common case: the thread is in epoll_wait), the mutex is taken with
 * the GIL kept: a GIL hand-off per call bought nothing (the bench's freeze of 5,000
 * connections took 301 ms under load). Contended, the GIL is released before waiting. Either way no thread ever waits for the GIL holding the mutex (the
 * forwarding thread never takes the GIL; a Python caller unlocks before retaking it).
 * Measured: a freeze of 2,000 idle connections, 63 ms with the GIL released on every
 * call, 29 ms so (the thread plane: 34 ms). */
#define LOCKED(c, ...)                                  \
    do {                                                \
        if (pthread_mutex_trylock(&(c)->mu) == 0) {     \
            __VA_ARGS__;                                \
            pthread_mutex_unlock(&(c)->mu);             \
        } else {                                        \
            Py_BEGIN_ALLOW_THREADS                      \
            pthread_mutex_lock(&(c)->mu);               \
            __VA_ARGS__;                                \
            pthread_mutex_unlock(&(c)->mu);             \
            Py_END_ALLOW_THREADS                        \
        }                                               \
    } while (0)

/* ---- Core ------------------------------------------------------------------------- */

static PyObject *core_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    CoreObject *c = (CoreObject *)type->tp_alloc(type, 0);
    if (c)
        c->ep = c->wake = c->notify = c->hold_fd = c->tfd = -1;
    return (PyObject *)c;
}

static int core_init(CoreObject *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"splice", NULL};
    int splice_ = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", names, &splice_))
        return -1;
    if (c->ep >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "the core was initialised already");
        return -1;
    }
    c->splice = splice_;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->hold_mu, NULL);
    pthread_cond_init(&c->hold_cv, NULL);
    c->ep = epoll_create1(EPOLL_CLOEXEC);
    c->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->notify = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    c->buf = malloc(COPY_CHUNK);
    if (c->ep < 0 || c->wake < 0 || c->notify < 0 || c->tfd < 0 || !c->buf) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = WAKE_ID};
    struct epoll_event tev = {.events = EPOLLIN, .data.fd = TIMER_ID};
    if (epoll_ctl(c->ep, EPOLL_CTL_ADD, c->wake, &ev) < 0 ||
        epoll_ctl(c->ep, EPOLL_CTL_ADD, c->tfd, &tev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static void core_join(CoreObject *c) {
    if (!c->running)
        return;
    uint64_t one = 1;
    __atomic_store_n(&c->stopping, 1, __ATOMIC_SEQ_CST);
    if (write(c->wake, &one, sizeof one) < 0) {
        /* EAGAIN: a wake-up is pending already */
    }
    pthread_join(c->thread, NULL);
    c->running = 0;
}

static void core_dealloc(CoreObject *c) {
    Py_BEGIN_ALLOW_THREADS core_join(c);
    Py_END_ALLOW_THREADS
    if (c->ep >= 0)
        close(c->ep);
    if (c->wake >= 0)
        close(c->wake);
    if (c->notify >= 0)
        close(c->notify);
    if (c->tfd >= 0)
        close(c->tfd);
    free(c->timed);
    for (int i = 0; i < c->npipes; i++) {
        close(c->pipes[i][0]);
        close(c->pipes[i][1]);
    }
    /* Links still referenced by the core (never ended, or their RELEASE not drained). */
    for (int i = 0; i < c->nout; i++)
        if (c->outbox[i].kind == EV_RELEASE)
            Py_DECREF(c->outbox[i].link);
    free(c->outbox);
    free(c->byfd);
    free(c->again);
    free(c->again_on);
    free(c->conn);
    free(c->buf);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->hold_mu);
    pthread_cond_destroy(&c->hold_cv);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *core_start(CoreObject *c, PyObject *unused) {
    if (c->running || c->ep < 0) {
        PyErr_SetString(PyExc_RuntimeError, "the core was started already");
        return NULL;
    }
    int rc = pthread_create(&c->thread, NULL, run, c);
    if (rc) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    c->running = 1;
    Py_RETURN_NONE;
}

static PyObject *core_stop(CoreObject *c, PyObject *unused) {
    /* The thread ends; links still in the plane stay their owners' to end (no syscall
     * is made for them any more: the epoll is closed). */
    Py_BEGIN_ALLOW_THREADS core_join(c);
    pthread_mutex_lock(&c->mu);
    if (c->ep >= 0) {
        close(c->ep);
        c->ep = -1;
    }
    for (int i = 0; i < c->npipes; i++) {
        close(c->pipes[i][0]);
        close(c->pipes[i][1]);
    }
    c->npipes = 0;
    pthread_mutex_unlock(&c->mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static int grow_byfd(CoreObject *c, int fd) {
    if (fd < c->nbyfd)
        return 0;
    int n = c->nbyfd ? c->nbyfd : 1024;
    while (n <= fd)
        n *= 2;
    LinkObject **grown = realloc(c->byfd, n * sizeof *grown);
    if (!grown)
        return -1;
    memset(grown + c->nbyfd, 0, (n - c->nbyfd) * sizeof *grown);
    c->byfd = grown;
    int *again = realloc(c->again, 2 * (size_t)n * sizeof *again);
    if (!again)
        return -1;
    c->again = again;
    char *on = realloc(c->again_on, (size_t)n);
    if (!on)
        return -1;
    memset(on + c->nbyfd, 0, (size_t)(n - c->nbyfd));
    c->again_on = on;
    c->nbyfd = n; /* last: the arrays above are at least this long */
    return 0;
}

static void lane_init(lane_t *l, int src, int dst) {
    memset(l, 0, sizeof *l);
    l->bound = INBOX_BYTES;
    l->src = src;
    l->dst = dst;
    l->open = 1;
    l->pipe_r = l->pipe_w = -1;
}

static int tcp_state(int fd) {
    struct tcp_info info;
    socklen_t len = sizeof info;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) < 0)
        return 0;
    return info.tcpi_state;
}

static PyObject *core_add(CoreObject *c, PyObject *args) {
    LinkObject *k;
    int client, server, frozen, to_trio;
    double timeout;
    if (!PyArg_ParseTuple(args, "O!iiiid", &LinkType, &k, &client, &server, &frozen,
                          &to_trio, &timeout))
        return NULL;
    if (k->core) {
        PyErr_SetString(PyExc_RuntimeError, "the link is in a plane already");
        return NULL;
    }
    if (c->ep < 0) {
        PyErr_SetString(PyExc_RuntimeError, "the plane has stopped");
        return NULL;
    }
    int err = 0;
    Py_INCREF(c);
    k->core = c;
    lane_init(&k->lanes[UP], client, server);
    lane_init(&k->lanes[DOWN], server, client);
    k->fds[0] = client;
    k->fds[1] = server;
    for (int s = 0; s < 2; s++) {
        k->lanes[s].open = !(frozen & (1 << s));
        k->lanes[s].to_trio = !!(to_trio & (1 << s));
    }
    Py_INCREF(k); /* the core's reference: dropped by drain() after the link's RELEASE */
    k->in_plane = 1;
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&c->mu);
    if (grow_byfd(c, client > server ? client : server) < 0) {
        err = ENOMEM;
    } else {
        c->byfd[client] = c->byfd[server] = k;
        if (timeout >= 0) {
            k->connecting = 1;
            /* Loopback: the handshake is over before connect() returns. */
            if (tcp_state(server) == TCP_STATE_SYN_SENT) {
                int ok = 1;
                if (c->nconn == c->capconn) {
                    int cap = c->capconn ? c->capconn * 2 : 16;
                    LinkObject **grown = realloc(c->conn, cap * sizeof *grown);
                    if (grown) {
                        c->conn = grown;
                        c->capconn = cap;
                    } else {
                        ok = 0;
                    }
                }
                if (ok) {
                    k->deadline = now_s() + timeout;
                    c->conn[c->nconn++] = k;
                    rearm(c, k);
                    uint64_t one = 1;
                    if (write(c->wake, &one, sizeof one) < 0) {
                        /* a wake-up is pending already */
                    }
                } else {
                    contain(c, k, "realloc", ENOMEM);
                }
            } else {
                connected(c, k);
            }
        } else {
            /* What already arrived moves now, in this thread. */
            service(c, client);
            if (!k->ended)
                service(c, server);
            rearm(c, k);
        }
    }
    pthread_mutex_unlock(&c->mu);
    Py_END_ALLOW_THREADS
    if (err) {
        k->in_plane = 0;
        Py_DECREF(k);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* A lane's pipeline (see _set_stage): its stage's kind and figures a, b, c; limit_data's
 * limit before it and slow_close's delay after it, each if >= 0. */
typedef struct {
    int kind;
    double a, b, c, limit, slow;
} pipeline_t;

static void stage_lane(CoreObject *c, LinkObject *k, int li, const pipeline_t *p);
static int plane_lane(CoreObject *c, LinkObject *k, int li);
static int stage_args_ok(int li, int kind);

/* One lane's words from set_stages' *words* entry: (draws, count), each an int to set
 * or None to keep the lane's own; has[0], has[1] say which are set. 0 on error. */
static int lane_words(PyObject *item, uint64_t *out, char *has) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
        PyErr_SetString(PyExc_ValueError, "words must hold (draws, count) tuples");
        return 0;
    }
    for (int j = 0; j < 2; j++) {
        PyObject *w = PyTuple_GET_ITEM(item, j);
        has[j] = w != Py_None;
        if (has[j]) {
            out[j] = PyLong_AsUnsignedLongLongMask(w);
            if (PyErr_Occurred())
                return 0;
        }
    }
    return 1;
}

/* A batch's lanes, parsed before the mutex is taken. */
typedef struct {
    pipeline_t p;
    uint64_t words[2]; /* the generator's state, limit_data's count */
    char has[2];       /* which of words to set */
} staged_t;

/* Parse set_stages' entry i (its link, pipeline and words) into *st. 0 on error. */
static int parse_staged(CoreObject *c, PyObject *links, PyObject *pipes, PyObject *words,
                        Py_ssize_t i, int li, staged_t *st) {
    PyObject *item = PyList_GET_ITEM(links, i);
    if (!PyObject_TypeCheck(item, &LinkType) || ((LinkObject *)item)->core != c) {
        PyErr_SetString(PyExc_ValueError, "links must be links of this plane");
        return 0;
    }
    pipeline_t *p = &st->p;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(pipes, i), "iddddd;pipelines must hold "
                          "(kind, a, b, c, limit, slow_ms) tuples", &p->kind, &p->a, &p->b,
                          &p->c, &p->limit, &p->slow))
        return 0;
    if (!stage_args_ok(li, p->kind))
        return 0;
    st->has[0] = st->has[1] = 0;
    return words == Py_None || lane_words(PyList_GET_ITEM(words, i), st->words, st->has);
}

/* set_stages(links, lane, pipelines, words): a compiled pipeline on lane *lane* of every
 * link in the list *links* (a toxic added to, or removed from, a proxy's connections:
 * issue 36), in one call and one hold of the mutex, so the add is one hand-off to the
 * plane, not a call per connection. Link i's lane gets what _set_stage gives it with
 * pipelines[i], a (kind, a, b, c, limit, slow_ms) tuple; where *words* is a list,
 * words[i] = (draws, count) first sets its generator state and limit_data's count (None:
 * the lane's own is kept). A lane still on the toxic path is then handed back to the
 * plane with its pipeline (_to_plane), as a toxic link's to_stage() does. A link that
 * has ended is left alone. */
static PyObject *core_set_stages(CoreObject *c, PyObject *args) {
    PyObject *links, *pipes, *words;
    int li;
    if (!PyArg_ParseTuple(args, "O!iO!O", &PyList_Type, &links, &li, &PyList_Type, &pipes,
                          &words))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(links);
    if (PyList_GET_SIZE(pipes) != n ||
        (words != Py_None && (!PyList_Check(words) || PyList_GET_SIZE(words) != n))) {
        PyErr_SetString(PyExc_ValueError,
                        "pipelines (and words, unless None) must be lists as long as links");
        return NULL;
    }
    staged_t *staged = n ? malloc(n * sizeof *staged) : NULL;
    if (n && !staged)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!parse_staged(c, links, pipes, words, i, li, &staged[i])) {
            free(staged);
            return NULL;
        }
    }
    /* The list holds its links: none is freed while the GIL is let go below. */
    LOCKED(c, {
        for (Py_ssize_t i = 0; i < n; i++) {
            LinkObject *k = (LinkObject *)PyList_GET_ITEM(links, i);
            const staged_t *st = &staged[i];
            if (k->ended)
                continue;
            if (st->has[0])
                k->lanes[li].draws = st->words[0];
            if (st->has[1])
                k->lanes[li].count = st->words[1];
            stage_lane(c, k, li, &st->p);
            if (st->p.kind != STAGE_NONE && k->lanes[li].to_trio)
                plane_lane(c, k, li);
        }
    });
    free(staged);
    Py_RETURN_NONE;
}

/* The arguments (links, mask) of a call on many links, parsed into *links* and *mask*:
 * 0 with an exception set unless *links* is a list of links of *c*. */
static int links_and_mask(CoreObject *c, PyObject *args, PyObject **links, int *mask) {
    if (!PyArg_ParseTuple(args, "O!i", &PyList_Type, links, mask))
        return 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(*links); i++) {
        PyObject *item = PyList_GET_ITEM(*links, i);
        if (!PyObject_TypeCheck(item, &LinkType) || ((LinkObject *)item)->core != c) {
            PyErr_SetString(PyExc_ValueError, "links must be links of this plane");
            return 0;
        }
    }
    return 1;
}

/* freeze(links, mask): close the gates of the lanes in *mask* on every link in the list
 * *links* (a fault on a proxy's connections: issue 36) in one call and one hold of the
 * mutex, total on return as _freeze is for each; returns (upstream, downstream), the
 * bytes the links had written when their gates closed, summed (their counters are final
 * for the frozen lanes). The debug switch set_unlocked applies as in _freeze. */
static PyObject *core_freeze(CoreObject *c, PyObject *args) {
    PyObject *links;
    int mask;
    if (!links_and_mask(c, args, &links, &mask))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(links);
    uint64_t up = 0, down = 0;
    if (c->unlocked) { /* the breakage, as link_freeze's */
        for (Py_ssize_t i = 0; i < n; i++) {
            LinkObject *k = (LinkObject *)PyList_GET_ITEM(links, i);
            for (int s = 0; s < 2; s++)
                if (mask & (1 << s))
                    __atomic_store_n(&k->lanes[s].open, 0, __ATOMIC_RELAXED);
            up += __atomic_load_n(&k->lanes[UP].bytes, __ATOMIC_RELAXED);
            down += __atomic_load_n(&k->lanes[DOWN].bytes, __ATOMIC_RELAXED);
        }
    } else {
        /* The list holds its links: none is freed while the GIL is let go. */
        LOCKED(c, {
            for (Py_ssize_t i = 0; i < n; i++) {
                LinkObject *k = (LinkObject *)PyList_GET_ITEM(links, i);
                for (int s = 0; s < 2; s++)
                    if (mask & (1 << s))
                        k->lanes[s].open = 0;
                up += k->lanes[UP].bytes;
                down += k->lanes[DOWN].bytes;
            }
        });
    }
    return Py_BuildValue("KK", (unsigned long long)up, (unsigned long long)down);
}

/* thaw(links, mask): open the gates of the lanes in *mask* on every link in the list
 * *links* in one call and one hold of the mutex, as _thaw does for each (an EOF due once
 * nothing is held, the lanes re-armed), what fell due on the stages' queues meanwhile
 * sent once, before the re-arms. One call where a thaw per link was a mutex and a GIL
 * hand-off each (issue 36: ~20 us a connection). An ended link is opened, left alone. */
static PyObject *core_thaw(CoreObject *c, PyObject *args) {
    PyObject *links;
    int mask;
    if (!links_and_mask(c, args, &links, &mask))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(links);
    /* The list holds its links: none is freed while the GIL is let go. */
    LOCKED(c, {
        for (Py_ssize_t i = 0; i < n; i++) {
            LinkObject *k = (LinkObject *)PyList_GET_ITEM(links, i);
            for (int s = 0; s < 2; s++) {
                if (!(mask & (1 << s)))
                    continue;
                k->lanes[s].open = 1;
                if (!k->ended)
                    maybe_eof(c, k, s);
            }
        }
        run_timers(c); /* before the re-arms, as _thaw: a queue sent changes a mask */
        for (Py_ssize_t i = 0; i < n; i++)
            rearm(c, (LinkObject *)PyList_GET_ITEM(links, i));
    });
    Py_RETURN_NONE;
}

static PyObject *core_settle(CoreObject *c, PyObject *unused) {
    if (c->unlocked) /* the breakage: no mutex to service anything under */
        Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&c->mu);
    if (c->ep >= 0) {
        struct epoll_event evs[MAX_EVENTS];
        int n = epoll_wait(c->ep, evs, MAX_EVENTS, 0);
        for (int i = 0; i < n; i++)
            if (evs[i].data.fd >= 0) { /* not the core's own eventfd or timerfd */
                note_hup(c, evs[i].data.fd, evs[i].events);
                service(c, evs[i].data.fd);
            }
        service_again(c);
        run_timers(c);
    }
    pthread_mutex_unlock(&c->mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* The batch of events: a list of (link, kind, lane), lane -1 for none. Drops the core's
 * reference to each link whose RELEASE is in the batch, once the list holds its own. */
static PyObject *core_drain(CoreObject *c, PyObject *unused) {
    event_t *batch;
    int n;
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&c->mu);
    uint64_t v;
    if (read(c->notify, &v, sizeof v) < 0) {
        /* EAGAIN: nothing was signalled (a drain without a wake-up) */
    }
    batch = c->outbox;
    n = c->nout;
    c->outbox = NULL;
    c->nout = c->capout = 0;
    c->scheduled = 0;
    pthread_mutex_unlock(&c->mu);
    Py_END_ALLOW_THREADS
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < n; i++) {
        if (batch[i].kind == EV_RELEASE)
            continue;
        PyObject *t = Py_BuildValue("Oii", batch[i].link, batch[i].kind, batch[i].lane);
        if (!t || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(t);
    }
    for (int i = 0; i < n; i++) {
        if (batch[i].kind == EV_RELEASE) {
            batch[i].link->in_plane = 0;
            Py_DECREF(batch[i].link);
        }
    }
    free(batch);
    return out;
}

static PyObject *core_set_unlocked(CoreObject *c, PyObject *arg) {
    c->unlocked = PyObject_IsTrue(arg);
    Py_RETURN_NONE;
}

static PyObject *core_set_widen(CoreObject *c, PyObject *arg) {
    long us = PyLong_AsLong(arg);
    if (us == -1 && PyErr_Occurred())
        return NULL;
    c->widen_us = (int)us;
    Py_RETURN_NONE;
}

static PyObject *core_set_edges_only(CoreObject *c, PyObject *arg) {
    c->edges_only = PyObject_IsTrue(arg);
    Py_RETURN_NONE;
}

static PyObject *core_hold_write(CoreObject *c, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&c->hold_mu);
    c->hold_entered = c->hold_go = 0;
    c->hold_fd = fd;
    pthread_mutex_unlock(&c->hold_mu);
    Py_RETURN_NONE;
}

static PyObject *core_wait_held(CoreObject *c, PyObject *arg) {
    double t = PyFloat_AsDouble(arg);
    if (t == -1 && PyErr_Occurred())
        return NULL;
    int entered;
    Py_BEGIN_ALLOW_THREADS struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)t;
    ts.tv_nsec += (long)((t - (time_t)t) * 1e9);
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&c->hold_mu);
    while (!c->hold_entered)
        if (pthread_cond_timedwait(&c->hold_cv, &c->hold_mu, &ts) == ETIMEDOUT)
            break;
    entered = c->hold_entered;
    pthread_mutex_unlock(&c->hold_mu);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(entered);
}

static PyObject *core_release_write(CoreObject *c, PyObject *unused) {
    pthread_mutex_lock(&c->hold_mu);
    c->hold_go = 1;
    c->hold_fd = -1;
    pthread_cond_broadcast(&c->hold_cv);
    pthread_mutex_unlock(&c->hold_mu);
    Py_RETURN_NONE;
}

static PyObject *core_notify_fd(CoreObject *c, void *unused) { return PyLong_FromLong(c->notify); }

static PyMethodDef core_methods[] = {
    {"start", (PyCFunction)core_start, METH_NOARGS, "Start the forwarding thread."},
    {"stop", (PyCFunction)core_stop, METH_NOARGS, "End the thread; close the epoll."},
    {"add", (PyCFunction)core_add, METH_VARARGS,
     "add(link, client_fd, server_fd, frozen_mask, to_trio_mask, connect_timeout or -1)"},
    {"settle", (PyCFunction)core_settle, METH_NOARGS, "Move what is ready now, here."},
    {"freeze", (PyCFunction)core_freeze, METH_VARARGS,
     "freeze(links, mask): close many links' gates at once; (up, down) bytes."},
    {"thaw", (PyCFunction)core_thaw, METH_VARARGS,
     "thaw(links, mask): open many links' gates at once."},
    {"set_stages", (PyCFunction)core_set_stages, METH_VARARGS,
     "set_stages(links, lane, pipelines, words): a pipeline on each of many links' lanes."},
    {"drain", (PyCFunction)core_drain, METH_NOARGS, "The batch of events [(link, kind, lane)]."},
    {"set_unlocked", (PyCFunction)core_set_unlocked, METH_O,
     "Debug: freeze and counts skip the mutex (the breakage of the stress test)."},
    {"set_edges_only", (PyCFunction)core_set_edges_only, METH_O,
     "Debug: serve a socket only on an epoll edge, never again unasked (lanes stall)."},
    {"set_widen", (PyCFunction)core_set_widen, METH_O,
     "Debug: sleep this many us between a gate's look and its syscall (a wider race)."},
    {"hold_write", (PyCFunction)core_hold_write, METH_O,
     "Debug: stop the thread inside its next write to fd, or just after its shutdown of fd "
     "(mutex held)."},
    {"wait_held", (PyCFunction)core_wait_held, METH_O,
     "Debug: wait (GIL released) until the held write has begun; True if it did."},
    {"release_write", (PyCFunction)core_release_write, METH_NOARGS, "Debug: let it go."},
    {NULL}};

static PyGetSetDef core_getset[] = {
    {"notify_fd", (getter)core_notify_fd, NULL, "The eventfd readable when events wait.", NULL},
    {NULL}};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "faultnet.planes._native.Core",
    .tp_basicsize = sizeof(CoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The forwarding core: one native thread, one epoll, one mutex.",
    .tp_new = core_new,
    .tp_init = (initproc)core_init,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_methods = core_methods,
    .tp_getset = core_getset,
};

/* ---- Link ------------------------------------------------------------------------- */

static int link_init(LinkObject *k, PyObject *args, PyObject *kw) {
    k->fds[0] = k->fds[1] = -1;
    k->lanes[0].pipe_r = k->lanes[0].pipe_w = -1;
    k->lanes[1].pipe_r = k->lanes[1].pipe_w = -1;
    return 0;
}

static void free_inbox(lane_t *l) {
    while (l->inbox) {
        chunk *next = l->inbox->next;
        free(l->inbox);
        l->inbox = next;
    }
    l->inbox_tail = NULL;
    l->inbox_bytes = 0;
}

static void link_dealloc(LinkObject *k) {
    for (int s = 0; s < 2; s++) {
        lane_t *l = &k->lanes[s];
        free(l->held);
        free_inbox(l);
        if (l->pipe_r >= 0) {
            close(l->pipe_r);
            close(l->pipe_w);
        }
    }
    Py_XDECREF(k->core);
    Py_TYPE(k)->tp_free((PyObject *)k);
}

static int lane_arg(PyObject *arg) {
    long i = PyLong_AsLong(arg);
    if (i == -1 && PyErr_Occurred())
        return -1;
    if (i != 0 && i != 1) {
        PyErr_SetString(PyExc_ValueError, "lane must be 0 (upstream) or 1 (downstream)");
        return -1;
    }
    return (int)i;
}

#define NEED_CORE(k)                                                        \
    if (!(k)->core) {                                                       \
        PyErr_SetString(PyExc_RuntimeError, "the link is in no plane");      \
        return NULL;                                                        \
    }

static PyObject *link_freeze(LinkObject *k, PyObject *arg) {
    NEED_CORE(k);
    long mask = PyLong_AsLong(arg);
    if (mask == -1 && PyErr_Occurred())
        return NULL;
    CoreObject *c = k->core;
    if (c->unlocked) { /* the breakage: the gates close while the thread may be mid-write */
        for (int s = 0; s < 2; s++)
            if (mask & (1 << s))
                __atomic_store_n(&k->lanes[s].open, 0, __ATOMIC_RELAXED);
        Py_RETURN_NONE;
    }
    LOCKED(c, {
        for (int s = 0; s < 2; s++)
            if (mask & (1 << s))
                k->lanes[s].open = 0;
    });
    Py_RETURN_NONE;
}

static PyObject *link_thaw(LinkObject *k, PyObject *arg) {
    NEED_CORE(k);
    long mask = PyLong_AsLong(arg);
    if (mask == -1 && PyErr_Occurred())
        return NULL;
    CoreObject *c = k->core;
    LOCKED(c, {
        for (int s = 0; s < 2; s++) {
            if (!(mask & (1 << s)))
                continue;
            k->lanes[s].open = 1;
            if (!k->ended)
                maybe_eof(c, k, s); /* an EOF due once nothing is held */
        }
        run_timers(c); /* a stage's queue: what fell due while frozen goes now */
        rearm(c, k);
    });
    Py_RETURN_NONE;
}

static PyObject *link_end(LinkObject *k, PyObject *unused) {
    NEED_CORE(k);
    CoreObject *c = k->core;
    int ended;
    LOCKED(c, ended = end_link(c, k));
    return PyBool_FromLong(ended);
}

static PyObject *link_counts(LinkObject *k, PyObject *unused) {
    uint64_t up, down;
    CoreObject *c = k->core;
    if (!c || c->unlocked) {
        up = __atomic_load_n(&k->lanes[UP].bytes, __ATOMIC_RELAXED);
        down = __atomic_load_n(&k->lanes[DOWN].bytes, __ATOMIC_RELAXED);
    } else {
        LOCKED(c, {
            up = k->lanes[UP].bytes;
            down = k->lanes[DOWN].bytes;
        });
    }
    return Py_BuildValue("KK", (unsigned long long)up, (unsigned long long)down);
}

static PyObject *link_eof_forwarded(LinkObject *k, PyObject *arg) {
    int li = lane_arg(arg);
    if (li < 0)
        return NULL;
    return PyBool_FromLong(__atomic_load_n(&k->lanes[li].eof_forwarded, __ATOMIC_ACQUIRE));
}

static PyObject *link_on_toxic_path(LinkObject *k, PyObject *arg) {
    int li = lane_arg(arg);
    if (li < 0)
        return NULL;
    return PyBool_FromLong(__atomic_load_n(&k->lanes[li].to_trio, __ATOMIC_RELAXED));
}

static PyObject *link_to_trio(LinkObject *k, PyObject *arg) {
    NEED_CORE(k);
    int li = lane_arg(arg);
    if (li < 0)
        return NULL;
    CoreObject *c = k->core;
    LOCKED(c, {
        lane_t *l = &k->lanes[li];
        if (!l->to_trio) {
            /* Off a compiled stage: what it queued goes to trio's chain with its read
             * times; the head's draw, if one was made, is undone (trio draws it again). */
            l->to_trio = 1;
            l->stage = STAGE_NONE;
            l->limit_on = l->slow_on = 0;
            l->bound = INBOX_BYTES; /* trio's chain: the toxic path's bound */
            if (l->head_set && l->head_drew)
                l->draws -= DRAW_GAMMA;
            l->head_set = 0;
            if (l->inbox && !l->notified && !k->ended) {
                l->notified = 1;
                post(c, k, EV_CHUNKS, li);
            }
        }
    });
    Py_RETURN_NONE;
}

/* The lane's compiled pipeline from now on, under the mutex: its stage latency (a ms,
 * jitter b ms), bandwidth (a KB/s, b unused), slicer (average_size a, size_variation b
 * bytes, delay c us), pass or timeout's drop (no figure: the toxic's timer is trio's);
 * limit_data's limit before it and slow_close's delay after it, each if >= 0 (kind
 * STAGE_NONE: none; what it queued then leaves at once, in order). A chunk whose delay
 * was drawn keeps it, as in the Python toxic (where that chunk is asleep). */
static void stage_lane(CoreObject *c, LinkObject *k, int li, const pipeline_t *p) {
    lane_t *l = &k->lanes[li];
    int kind = p->kind;
    if (kind == STAGE_NONE) /* removed: the chunk it held goes too (as Toxiproxy's) */
        l->head_set = 0;
    if (kind != l->stage) /* a new stage starts with no backlog */
        l->clock = l->next_set = 0;
    if (!l->limit_on)
        l->limit_closed = 0;
    if (!l->slow_on)
        l->eof_at = 0;
    l->limit_on = kind != STAGE_NONE && p->limit >= 0;
    l->limit = (long long)p->limit;
    l->slow_on = kind != STAGE_NONE && p->slow >= 0;
    l->slow_ms = p->slow;
    if (l->head_set && l->inbox && !l->inbox->len)
        l->head_set = 0; /* a held FIN's due time moves with slow_close's delay */
    l->stage = kind == STAGE_NONE && l->inbox && !l->to_trio ? STAGE_DRAIN : kind;
    if (kind == STAGE_BANDWIDTH) {
        l->rate_kbps = p->a;
    } else if (kind == STAGE_SLICER) {
        l->slice_avg = (long long)p->a;
        l->slice_var = (long long)p->b;
        l->slice_delay = p->c > 0 ? p->c / 1e6 : 0;
    } else {
        l->lat_ms = p->a;
        l->jit_ms = p->b;
    }
    l->bound = kind == STAGE_LATENCY ? stage_bound(p->a, p->b) : INBOX_BYTES;
    if (!k->ended && !l->to_trio && l->inbox) {
        if (list_timed(c, k, li) < 0)
            contain(c, k, "realloc", ENOMEM);
        run_timers(c);
        rearm(c, k);
    }
}

/* Back from trio to the plane, under the mutex: 0 (nothing changed) while chunks read
 * for trio wait in the inbox with no stage (trio takes them first); else the lane
 * forwards by itself again, at once: bytes trio's last offer left held go out first
 * (they are the lane's held bytes), then what the socket has, read here as add() does
 * (no edge may come for bytes already queued). With a stage, what trio has not taken is
 * the stage's to deliver. */
static int plane_lane(CoreObject *c, LinkObject *k, int li) {
    lane_t *l = &k->lanes[li];
    if (l->inbox && !l->stage)
        return 0;
    l->to_trio = l->waiting = l->notified = 0;
    if (l->inbox && list_timed(c, k, li) < 0)
        contain(c, k, "realloc", ENOMEM);
    if (!k->ended && !k->connecting) {
        handle(c, k, li);
        run_timers(c);
    }
    return 1;
}

static int stage_args_ok(int li, int kind) {
    if ((li != 0 && li != 1) || kind < STAGE_NONE || kind == STAGE_DRAIN || kind > STAGE_LAST) {
        PyErr_SetString(PyExc_ValueError, "lane must be 0 or 1, kind a STAGE_ constant");
        return 0;
    }
    return 1;
}

/* _set_stage(lane, kind, a, b[, c[, limit[, slow_ms]]]): the lane's compiled pipeline (see
 * stage_lane). */
static PyObject *link_set_stage(LinkObject *k, PyObject *args) {
    NEED_CORE(k);
    int li, kind;
    double lat, jit, third = 0, limit = -1, slow = -1;
    if (!PyArg_ParseTuple(args, "iidd|ddd", &li, &kind, &lat, &jit, &third, &limit, &slow))
        return NULL;
    if (!stage_args_ok(li, kind))
        return NULL;
    CoreObject *c = k->core;
    pipeline_t p = {kind, lat, jit, third, limit, slow};
    LOCKED(c, stage_lane(c, k, li, &p));
    Py_RETURN_NONE;
}

/* A size_t field of a lane (at offset *off* in lane_t), read under the mutex. */
static PyObject *lane_size(LinkObject *k, PyObject *arg, size_t off) {
    NEED_CORE(k);
    int li = lane_arg(arg);
    if (li < 0)
        return NULL;
    size_t n;
    LOCKED(k->core, n = *(const size_t *)((const char *)&k->lanes[li] + off));
    return PyLong_FromSize_t(n);
}

/* _queued(lane): the bytes the lane's inbox holds, as counted against its bound. */
static PyObject *link_queued(LinkObject *k, PyObject *arg) {
    return lane_size(k, arg, offsetof(lane_t, inbox_bytes));
}

/* _bound(lane): the lane's inbox bound in bytes (INBOX_BYTES, or its stage's). */
static PyObject *link_bound(LinkObject *k, PyObject *arg) {
    return lane_size(k, arg, offsetof(lane_t, bound));
}

/* A uint64_t word of a lane's pipeline (at offset *off* in lane_t): (lane[, value]),
 * set first if given, then read, under the mutex. */
static PyObject *lane_word(LinkObject *k, PyObject *args, size_t off) {
    NEED_CORE(k);
    int li;
    PyObject *state = NULL;
    if (!PyArg_ParseTuple(args, "i|O", &li, &state))
        return NULL;
    if (li != 0 && li != 1) {
        PyErr_SetString(PyExc_ValueError, "lane must be 0 or 1");
        return NULL;
    }
    uint64_t set = 0, got;
    if (state) {
        set = PyLong_AsUnsignedLongLongMask(state);
        if (PyErr_Occurred())
            return NULL;
    }
    LOCKED(k->core, {
        uint64_t *word = (uint64_t *)((char *)&k->lanes[li] + off);
        if (state)
            *word = set;
        got = *word;
    });
    return PyLong_FromUnsignedLongLong(got);
}

/* _stage_draws(lane[, state]): the lane's generator state (set it first if given). */
static PyObject *link_stage_draws(LinkObject *k, PyObject *args) {
    return lane_word(k, args, offsetof(lane_t, draws));
}

/* _stage_count(lane[, count]): limit_data's count of bytes passed (set it first if given). */
static PyObject *link_stage_count(LinkObject *k, PyObject *args) {
    return lane_word(k, args, offsetof(lane_t, count));
}

/* _to_plane(lane): back from trio to the plane (see plane_lane). */
static PyObject *link_to_plane(LinkObject *k, PyObject *arg) {
    NEED_CORE(k);
    int li = lane_arg(arg);
    if (li < 0)
        return NULL;
    CoreObject *c = k->core;
    int done;
    LOCKED(c, done = plane_lane(c, k, li));
    return PyBool_FromLong(done);
}

/* _take(lane, timed): the chunks read for trio, as bytes, or with timed as
 * (bytes, CLOCK_MONOTONIC read time) pairs. */
static PyObject *link_take(LinkObject *k, PyObject *args) {
    NEED_CORE(k);
    int li, timed = 0;
    if (!PyArg_ParseTuple(args, "i|p", &li, &timed))
        return NULL;
    if (li != 0 && li != 1) {
        PyErr_SetString(PyExc_ValueError, "lane must be 0 or 1");
        return NULL;
    }
    CoreObject *c = k->core;
    chunk *got;
    LOCKED(c, {
        lane_t *l = &k->lanes[li];
        got = l->inbox;
        l->inbox = l->inbox_tail = NULL;
        l->inbox_bytes = 0;
        l->notified = 0;
        if (got && !k->ended)
            rearm(c, k);
    });
    PyObject *out = PyList_New(0);
    while (got) {
        chunk *next = got->next;
        if (out) {
            PyObject *b =
                PyBytes_FromStringAndSize(got->data + got->off, (Py_ssize_t)(got->len - got->off));
            if (b && timed) {
                PyObject *pair = Py_BuildValue("(Nd)", b, got->t);
                b = pair;
            }
            if (!b || PyList_Append(out, b) < 0)
                Py_CLEAR(out);
            Py_XDECREF(b);
        }
        free(got);
        got = next;
    }
    return out;
}

static PyObject *link_offer(LinkObject *k, PyObject *args) {
    NEED_CORE(k);
    int li;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "iy*", &li, &view))
        return NULL;
    if (li != 0 && li != 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "lane must be 0 or 1");
        return NULL;
    }
    CoreObject *c = k->core;
    int result, err = 0; /* 1 written, 0 refused, -1 ended (err) */
    LOCKED(c, {
        lane_t *l = &k->lanes[li];
        if (k->ended) {
            result = -1;
            err = k->err ? k->err : EBADF;
        } else if (!l->open || l->held || l->piped) {
            l->waiting = 1;
            result = 0;
        } else if (send_fresh(c, k, li, view.buf, (size_t)view.len) < 0) {
            result = -1;
            err = k->err ? k->err : EBADF;
        } else {
            l->waiting = l->held != NULL;
            rearm(c, k);
            result = 1;
        }
    });
    PyBuffer_Release(&view);
    if (result < 0) {
        PyObject *exc = Py_BuildValue("(is)", err, strerror(err));
        if (exc) {
            PyErr_SetObject(PyExc_ConnectionResetError, exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    return PyBool_FromLong(result);
}

static PyObject *link_offer_eof(LinkObject *k, PyObject *arg) {
    NEED_CORE(k);
    int li = lane_arg(arg);
    if (li < 0)
        return NULL;
    CoreObject *c = k->core;
    int result;
    LOCKED(c, {
        lane_t *l = &k->lanes[li];
        if (k->ended || l->eof_forwarded) {
            result = 1;
        } else if (!l->open) {
            l->waiting = 1;
            result = 0;
        } else {
            l->eof_pending = 1;
            maybe_eof(c, k, li);
            result = 1;
        }
    });
    return PyBool_FromLong(result);
}

/* _reroute(fd): the link's second socket is fd from now on, in place of the server's
 * (the internal hop of two-way loss: faultnet/proxy/_hop.py): the upstream lane writes
 * to it, the downstream lane reads it. What the lanes hold keeps its order: held or
 * piped upstream bytes go to fd, held or piped downstream bytes (read from the former
 * socket) still go to the client. An upstream EOF already forwarded is forwarded to fd
 * too (its peer must see it). The former socket leaves the plane (no interest, no
 * byfd entry): the caller adds it to another link. False (nothing changed) while the
 * link is connecting or has ended. Kept in a function of its own (not in core_add's
 * path): nothing else in the core changes a link's descriptors. */
static int reroute_link(CoreObject *c, LinkObject *k, int fd) {
    if (k->ended || k->connecting)
        return 0;
    if (grow_byfd(c, fd) < 0) {
        contain(c, k, "realloc", ENOMEM);
        return 0;
    }
    int old = k->fds[1];
    if (k->mask[1] && c->ep >= 0)
        epoll_ctl(c->ep, EPOLL_CTL_DEL, old, NULL);
    k->mask[1] = 0;
    if (old >= 0 && old < c->nbyfd && c->byfd[old] == k)
        c->byfd[old] = NULL;
    k->fds[1] = fd;
    c->byfd[fd] = k;
    k->lanes[UP].dst = fd;
    lane_t *down = &k->lanes[DOWN];
    down->src = fd;
    down->rdhup = 0;  /* the former socket's */
    down->burst = 0;  /* a burst of the former socket's: what is piped still goes out */
    if (__atomic_load_n(&k->lanes[UP].eof_forwarded, __ATOMIC_ACQUIRE) &&
        shutdown(fd, SHUT_WR) < 0 && errno != ENOTCONN) {
        fail(c, k, UP, errno);
        return 1;
    }
    service(c, fd); /* what the new socket has now: no edge announces it */
    if (!k->ended)
        service(c, k->fds[0]);
    rearm(c, k);
    return 1;
}

static PyObject *link_reroute(LinkObject *k, PyObject *arg) {
    NEED_CORE(k);
    int fd = (int)PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0) {
        PyErr_SetString(PyExc_ValueError, "fd must be a descriptor");
        return NULL;
    }
    CoreObject *c = k->core;
    int done;
    uint64_t up = 0;
    LOCKED(c, {
        up = k->lanes[UP].bytes; /* what the server's socket took: the rerouted count's base */
        done = reroute_link(c, k, fd);
    });
    if (!done)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong((unsigned long long)up);
}

static PyObject *link_fail_next(LinkObject *k, PyObject *unused) {
    NEED_CORE(k);
    LOCKED(k->core, k->fail_next = 1);
    Py_RETURN_NONE;
}

static PyObject *link_get_connecting(LinkObject *k, void *u) {
    return PyBool_FromLong(__atomic_load_n(&k->connecting, __ATOMIC_ACQUIRE));
}
static PyObject *link_get_ended(LinkObject *k, void *u) {
    return PyBool_FromLong(__atomic_load_n(&k->ended, __ATOMIC_ACQUIRE));
}
static PyObject *link_get_errno(LinkObject *k, void *u) { return PyLong_FromLong(k->err); }
/* Whether the lane holds bytes it read and has not written (held, in its pipe, or in the
 * toxic path's inbox): what a close now would lose. Under the mutex. */
static PyObject *link_holding(LinkObject *k, PyObject *arg) {
    int li = lane_arg(arg);
    if (li < 0)
        return NULL;
    CoreObject *c = k->core;
    lane_t *l = &k->lanes[li];
    int holding = 0;
    if (c)
        LOCKED(c, holding = l->held != NULL || l->piped > 0 || l->inbox != NULL);
    return PyBool_FromLong(holding);
}

static PyObject *link_get_errmsg(LinkObject *k, void *u) {
    if (!k->errmsg[0])
        Py_RETURN_NONE;
    return PyUnicode_FromString(k->errmsg);
}
static PyObject *link_get_in_plane(LinkObject *k, void *u) { return PyBool_FromLong(k->in_plane); }

static PyMethodDef link_methods[] = {
    {"_freeze", (PyCFunction)link_freeze, METH_O, "Close the gates of the lanes in mask."},
    {"_thaw", (PyCFunction)link_thaw, METH_O, "Open the gates of the lanes in mask."},
    {"end", (PyCFunction)link_end, METH_NOARGS, "Take the link out of the plane."},
    {"counts", (PyCFunction)link_counts, METH_NOARGS, "(upstream, downstream) bytes written."},
    {"_eof_forwarded", (PyCFunction)link_eof_forwarded, METH_O, ""},
    {"_on_toxic_path", (PyCFunction)link_on_toxic_path, METH_O, ""},
    {"_holding", (PyCFunction)link_holding, METH_O, ""},
    {"_to_trio", (PyCFunction)link_to_trio, METH_O, ""},
    {"_to_plane", (PyCFunction)link_to_plane, METH_O, ""},
    {"_take", (PyCFunction)link_take, METH_VARARGS, ""},
    {"_offer", (PyCFunction)link_offer, METH_VARARGS, ""},
    {"_offer_eof", (PyCFunction)link_offer_eof, METH_O, ""},
    {"_set_stage", (PyCFunction)link_set_stage, METH_VARARGS, ""},
    {"_stage_draws", (PyCFunction)link_stage_draws, METH_VARARGS, ""},
    {"_stage_count", (PyCFunction)link_stage_count, METH_VARARGS, ""},
    {"_queued", (PyCFunction)link_queued, METH_O, "Bytes queued in the lane's inbox."},
    {"_bound", (PyCFunction)link_bound, METH_O, "The lane's inbox bound in bytes."},
    {"_reroute", (PyCFunction)link_reroute, METH_O,
     "The link's second socket is fd from now on (the hop: see reroute_link): the bytes "
     "upstream wrote to the former one, or None (nothing changed)."},
    {"_fail_next", (PyCFunction)link_fail_next, METH_NOARGS,
     "Debug: the next handling of this link meets a bug (ERROR)."},
    {NULL}};

static PyGetSetDef link_getset[] = {
    {"connecting", (getter)link_get_connecting, NULL, "The upstream connect is under way.", NULL},
    {"ended", (getter)link_get_ended, NULL, "The link has left the plane.", NULL},
    {"errno", (getter)link_get_errno, NULL, "The errno behind RESET or UPSTREAM_FAILED.", NULL},
    {"_error_message", (getter)link_get_errmsg, NULL, "What ERROR met.", NULL},
    {"_in_plane", (getter)link_get_in_plane, NULL, "The core still holds a reference.", NULL},
    {NULL}};

static PyTypeObject LinkType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "faultnet.planes._native.Link",
    .tp_basicsize = sizeof(LinkObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "One connection in the core: two lanes (0 upstream, 1 downstream).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)link_init,
    .tp_dealloc = (destructor)link_dealloc,
    .tp_methods = link_methods,
    .tp_getset = link_getset,
};

/* draws(seed, n, a, b): n uniform draws in [a, b) from splitmix64 seeded *seed* (the
 * test that faultnet/toxics/draws.py draws the same). */
static PyObject *module_draws(PyObject *m, PyObject *args) {
    unsigned long long seed;
    int n;
    double a, b;
    if (!PyArg_ParseTuple(args, "Kidd", &seed, &n, &a, &b))
        return NULL;
    uint64_t state = seed;
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < n; i++) {
        PyObject *f = PyFloat_FromDouble(draw_uniform(&state, a, b));
        if (!f || PyList_Append(out, f) < 0)
            Py_CLEAR(out);
        Py_XDECREF(f);
    }
    return out;
}

/* slices(seed, length, average, variation): the piece sizes the slicer stage cuts a chunk
 * of *length* bytes into, its generator seeded *seed* (the test that slicer.py cuts the
 * same). */
static PyObject *module_slices(PyObject *m, PyObject *args) {
    unsigned long long seed;
    Py_ssize_t length;
    long long avg, var;
    if (!PyArg_ParseTuple(args, "KnLL", &seed, &length, &avg, &var))
        return NULL;
    lane_t l;
    memset(&l, 0, sizeof l);
    l.draws = seed;
    l.slice_avg = avg;
    l.slice_var = var;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t pos = 0; out && pos < length; pos += (Py_ssize_t)l.piece) {
        chunk ch = {.len = (size_t)length, .off = (size_t)pos};
        l.piece = ch.len - ch.off;
        (void)slice_head(&l, &ch, 0);
        PyObject *n = PyLong_FromSize_t(l.piece);
        if (!n || PyList_Append(out, n) < 0)
            Py_CLEAR(out);
        Py_XDECREF(n);
    }
    return out;
}

static PyMethodDef module_methods[] = {
    {"draws", module_draws, METH_VARARGS, "draws(seed, n, a, b): the stages' generator."},
    {"slices", module_slices, METH_VARARGS,
     "slices(seed, length, average, variation): the slicer stage's piece sizes."},
    {NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "faultnet.planes._native",
    "The native data plane's forwarding core (see faultnet/planes/native.py).", -1, module_methods,
    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&LinkType) < 0 || PyType_Ready(&CoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&LinkType);
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Link", (PyObject *)&LinkType) < 0 ||
        PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0)
        return NULL;
    PyModule_AddIntConstant(m, "RESET", EV_RESET);
    PyModule_AddIntConstant(m, "DONE", EV_DONE);
    PyModule_AddIntConstant(m, "CHUNKS", EV_CHUNKS);
    PyModule_AddIntConstant(m, "DRAINED", EV_DRAINED);
    PyModule_AddIntConstant(m, "ERROR", EV_ERROR);
    PyModule_AddIntConstant(m, "UPSTREAM_FAILED", EV_UPSTREAM_FAILED);
    PyModule_AddIntConstant(m, "CLOSE", EV_CLOSE);
    PyModule_AddIntConstant(m, "COPY_CHUNK", COPY_CHUNK);
    PyModule_AddIntConstant(m, "INBOX_BYTES", INBOX_BYTES);
    PyModule_AddIntConstant(m, "CHUNK_COST", CHUNK_COST);
    PyModule_AddIntConstant(m, "STAGE_MAX_BYTES", STAGE_MAX_BYTES);
    PyModule_AddObject(m, "STAGE_RATE", PyFloat_FromDouble(STAGE_RATE));
    PyModule_AddIntConstant(m, "STAGE_NONE", STAGE_NONE);
    PyModule_AddIntConstant(m, "STAGE_LATENCY", STAGE_LATENCY);
    PyModule_AddIntConstant(m, "STAGE_BANDWIDTH", STAGE_BANDWIDTH);
    PyModule_AddIntConstant(m, "STAGE_SLICER", STAGE_SLICER);
    PyModule_AddIntConstant(m, "STAGE_PASS", STAGE_PASS);
    PyModule_AddIntConstant(m, "STAGE_DROP", STAGE_DROP);
    return m;
}
