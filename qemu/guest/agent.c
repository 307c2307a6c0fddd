/* kvcxl-agent: the guest side of kvcxl.  Runs inside the QEMU guest on /dev/dax0.0 (the
 * CXL Type-3 device's memory) and talks to the firmware service through the
 * command/completion ring that lives in device memory (kvcxl_ring.h, docs/qemu.md).
 *
 *   kvcxl-agent --dax /dev/dax0.0 --base GPA [--poison DPA:LEN,...] [--heartbeat-ms MS] JOB
 *   JOB = datapath | replay | malformed | fuzz | widths | widths_in_line | bench
 *
 * Every result is one line "@kvcxl {json}" on stdout.  Exit status: 0 ok, 1 a check
 * failed (bytes differ, residency disagrees), 2 usage or setup error, 3 device error
 * (the service stopped answering or reported a fault). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <emmintrin.h>

#include "kvcxl_pattern.h" /* and the generated kvcxl_ring.h */

/* How long the firmware may be silent (no heartbeat, ring not ready, plugin not armed)
 * before the agent calls it a device error: the host sets it for its machine with
 * --heartbeat-ms (a loaded 2-core host can stall a Python device for seconds); the
 * longest silence the agent saw is in every result (heartbeat_gap_max_ms). */
static uint64_t silence_ns = 3000000000ull;
static uint64_t gap_max_ns; /* the longest wait for a heartbeat change seen so far */
#define PROGRESS_NS 10000000000ull /* a long job says how far it got this often */
#define MAX_POISON 64
#define ATTN_MAX (KVCXL_SLOT_IN / sizeof(struct kvcxl_attn_rec) / 2) /* 512 records */

static uint8_t *dev;      /* /dev/dax0.0 mapped */
static uint64_t dev_size; /* bytes */
static uint64_t base_gpa;
static uint32_t sq_tail, cq_head, next_cid = 1;
static struct { uint64_t dpa, len; } poison[MAX_POISON];
static int n_poison;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void emit(const char *event, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    printf("@kvcxl {\"event\":\"%s\"%s%s}\n", event, *buf ? "," : "", buf);
    fflush(stdout);
}

static void die(int code, const char *event, const char *why)
{
    emit(event, "\"reason\":\"%s\"", why);
    exit(code);
}

/* Copies to and from device memory in 8-byte words: under TCG every access to the CXL
 * window is an emulated MMIO access, and glibc's memcpy (rep movsb on CPUs with ERMS)
 * would make one per byte. */
static void dev_read(void *dst, const uint8_t *src, uint64_t n)
{
    const volatile uint64_t *s = (const volatile uint64_t *)src;
    uint64_t *d = dst;
    for (uint64_t i = 0; i < n / 8; i++)
        d[i] = s[i];
    for (uint64_t i = n & ~7ull; i < n; i++)
        ((uint8_t *)dst)[i] = ((const volatile uint8_t *)src)[i];
}

static void dev_write(uint8_t *dst, const void *src, uint64_t n)
{
    volatile uint64_t *d = (volatile uint64_t *)dst;
    const uint64_t *s = src;
    for (uint64_t i = 0; i < n / 8; i++)
        d[i] = s[i];
    for (uint64_t i = n & ~7ull; i < n; i++)
        ((volatile uint8_t *)dst)[i] = ((const uint8_t *)src)[i];
}

/* --- device memory access: volatile, so every load and store reaches the device --- */
static inline volatile struct kvcxl_dev_hdr *dhdr(void)
{
    return (volatile struct kvcxl_dev_hdr *)(dev + KVCXL_RING_BASE + KVCXL_DEV_HDR);
}
static inline volatile struct kvcxl_host_hdr *hhdr(void)
{
    return (volatile struct kvcxl_host_hdr *)(dev + KVCXL_RING_BASE + KVCXL_HOST_HDR);
}
static inline volatile struct kvcxl_sqe *sqe_at(uint32_t i)
{
    return (volatile struct kvcxl_sqe *)(dev + KVCXL_RING_BASE + KVCXL_SQ +
                                         (i % KVCXL_DEPTH) * KVCXL_ENTRY);
}
static inline volatile struct kvcxl_cqe *cqe_at(uint32_t i)
{
    return (volatile struct kvcxl_cqe *)(dev + KVCXL_RING_BASE + KVCXL_CQ +
                                         (i % KVCXL_DEPTH) * KVCXL_ENTRY);
}
static inline uint8_t *slot_in(uint32_t i)
{
    return dev + KVCXL_RING_BASE + KVCXL_SLOTS + (i % KVCXL_DEPTH) * KVCXL_SLOT_STRIDE;
}
static inline uint8_t *slot_out(uint32_t i) { return slot_in(i) + KVCXL_SLOT_IN; }

/* Wait for the service to mark the ring ready (it initialises the header). */
static void ring_wait_ready(void)
{
    uint64_t t0 = now_ns();
    while (!(dhdr()->magic == KVCXL_RING_MAGIC && dhdr()->status == KVCXL_DEV_READY)) {
        if (now_ns() - t0 > silence_ns)
            die(3, "device_error", "ring not ready (no firmware service)");
        usleep(1000);
    }
    if (dhdr()->version != KVCXL_RING_VERSION || dhdr()->depth != KVCXL_DEPTH)
        die(3, "device_error", "ring version or depth mismatch");
    sq_tail = hhdr()->sq_tail;
    cq_head = hhdr()->cq_head;
}

static uint16_t call(uint16_t op, uint32_t step, uint32_t layer, uint32_t count,
                     const void *payload, uint32_t in_len, uint64_t arg0, uint64_t arg1,
                     struct kvcxl_cqe *out);

/* With the TCG plugin, the first command arms it; wait until it records, so that every
 * device access of the job is seen (at most 5 s, then go on and say so). */
static void wait_tracing(void)
{
    if (dhdr()->tracing != 1)
        return;
    call(KVCXL_OP_NOP, 0, 0, 0, NULL, 0, 0, 0, NULL);
    uint64_t t0 = now_ns();
    while (dhdr()->tracing == 1 && now_ns() - t0 < silence_ns)
        usleep(1000);
    emit("tracing", "\"state\":%u,\"waited_ms\":%llu", dhdr()->tracing,
         (unsigned long long)((now_ns() - t0) / 1000000));
}

/* Write one command at the tail without ringing (ring() submits all enqueued); payload
 * (if any) goes to the slot's input buffer.  Returns the submission index, whose
 * completion is cqe_at(index) once seq == index + 1. */
static uint32_t enqueue(uint16_t op, uint32_t step, uint32_t layer, uint32_t count,
                        const void *payload, uint32_t in_len, uint64_t arg0, uint64_t arg1)
{
    uint32_t i = sq_tail;
    if (in_len)
        dev_write(slot_in(i), payload, in_len);
    volatile struct kvcxl_sqe *e = sqe_at(i);
    e->opcode = op;
    e->flags = 0;
    e->cid = next_cid++;
    e->step = step;
    e->layer = layer;
    e->count = count;
    e->in_len = in_len;
    e->arg0 = arg0;
    e->arg1 = arg1;
    sq_tail = i + 1;
    return i;
}

/* The doorbell: one write of sq_tail hands every enqueued command to the device (on the
 * patched QEMU a trapped write the device serves before it completes, so one ring for a
 * batch is one round trip, as an NVMe host rings once per batch). */
static void ring(void)
{
    __sync_synchronize(); /* entries and payloads before the doorbell */
    hhdr()->sq_tail = sq_tail;
}

/* Enqueue one command and ring for it. */
static uint32_t submit(uint16_t op, uint32_t step, uint32_t layer, uint32_t count,
                       const void *payload, uint32_t in_len, uint64_t arg0, uint64_t arg1)
{
    uint32_t i = enqueue(op, step, layer, count, payload, in_len, arg0, arg1);
    ring();
    return i;
}

/* Wait for completion `i`; a silent heartbeat or a fault status is a device error. */
static volatile struct kvcxl_cqe *wait_cqe(uint32_t i)
{
    volatile struct kvcxl_cqe *c = cqe_at(i);
    /* The heartbeat is read only once the completion is late: on the patched QEMU the
     * device header shares the doorbell's trapped page, so each read is a request to
     * the device, which a completion that is already there must not pay. */
    uint64_t hb = 0, t_hb = 0;
    unsigned spins = 0;
    while (c->seq != i + 1) {
        if (++spins < 64)
            continue;
        if (spins == 64) {
            hb = dhdr()->heartbeat;
            t_hb = now_ns();
        }
        uint64_t h = dhdr()->heartbeat, t = now_ns();
        if (t - t_hb > gap_max_ns)
            gap_max_ns = t - t_hb;
        if (h != hb) {
            hb = h;
            t_hb = t;
        } else if (t - t_hb > silence_ns) {
            emit("device_error",
                 "\"reason\":\"no heartbeat for %llu ms (the budget: %llu ms)\",\"pending\":%u",
                 (unsigned long long)((t - t_hb) / 1000000),
                 (unsigned long long)(silence_ns / 1000000), i);
            exit(3);
        }
        if (dhdr()->status == KVCXL_DEV_FAULT)
            die(3, "device_error", "device reports fault");
        usleep(20);
    }
    __sync_synchronize();
    return c;
}

static void consume(uint32_t i)
{
    cq_head = i + 1;
    hhdr()->cq_head = cq_head;
}

/* Run one command synchronously and return its status (and the completion). */
static uint16_t call(uint16_t op, uint32_t step, uint32_t layer, uint32_t count,
                     const void *payload, uint32_t in_len, uint64_t arg0, uint64_t arg1,
                     struct kvcxl_cqe *out)
{
    uint32_t i = submit(op, step, layer, count, payload, in_len, arg0, arg1);
    volatile struct kvcxl_cqe *c = wait_cqe(i);
    if (out)
        dev_read(out, (const uint8_t *)c, sizeof *out);
    uint16_t st = c->status;
    consume(i);
    return st;
}

/* --- byte patterns ----------------------------------------------------------------- */
static void fill(uint8_t *dst, uint32_t seed, uint32_t id, uint64_t bytes)
{
    uint64_t *w = (uint64_t *)dst;
    for (uint64_t k = 0; k < bytes / 8; k++)
        w[k] = kvcxl_pattern(seed, id, k);
}

/* Number of bytes that differ from the pattern. */
static uint64_t check(const uint8_t *src, uint32_t seed, uint32_t id, uint64_t bytes)
{
    const uint64_t *w = (const uint64_t *)src;
    uint64_t bad = 0;
    for (uint64_t k = 0; k < bytes / 8; k++) {
        uint64_t x = w[k] ^ kvcxl_pattern(seed, id, k);
        if (x)
            for (int b = 0; b < 8; b++)
                bad += ((x >> (8 * b)) & 0xff) != 0;
    }
    return bad;
}

static int poisoned(uint64_t dpa, uint64_t len)
{
    for (int i = 0; i < n_poison; i++)
        if (dpa < poison[i].dpa + poison[i].len && poison[i].dpa < dpa + len)
            return 1;
    return 0;
}

/* --- jobs -------------------------------------------------------------------------- */

static int job_datapath(void)
{
    uint8_t *buf = malloc(KVCXL_XFER_BYTES);
    dev_read(buf, dev + KVCXL_XFER_H2G, KVCXL_XFER_BYTES);
    uint64_t bad = check(buf, KVCXL_SEED_H2G, 0, KVCXL_XFER_BYTES);
    fill(buf, KVCXL_SEED_G2H, 0, KVCXL_XFER_BYTES);
    dev_write(dev + KVCXL_XFER_G2H, buf, KVCXL_XFER_BYTES);
    __sync_synchronize();
    emit("datapath", "\"host_to_guest_bytes\":%llu,\"host_to_guest_bad\":%llu,"
                     "\"guest_to_host_bytes\":%llu,\"first_word\":\"0x%016llx\"",
         (unsigned long long)KVCXL_XFER_BYTES, (unsigned long long)bad,
         (unsigned long long)KVCXL_XFER_BYTES, (unsigned long long)((uint64_t *)buf)[0]);
    free(buf);
    return bad ? 1 : 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Apply a CREATE/ATTN completion to the HBM stand-in: admitted entries are copied from
 * device memory into local memory, victims are dropped. */
struct hbm {
    uint32_t n, E, cap, seed, n_free;
    uint8_t *mem, *is_poisoned, *hinted;
    int32_t *slot_of, *free_slots;
    uint64_t admitted, victims, to_nvme, hints, mismatch, vhash;
};

static void apply(struct hbm *h, const struct kvcxl_cqe *c, uint32_t slot)
{
    const uint8_t *out = slot_out(slot);
    const uint32_t *adm = (const uint32_t *)out;
    const struct kvcxl_victim *vic = (const struct kvcxl_victim *)(out + 4 * c->r1);
    const uint32_t *hint = (const uint32_t *)(out + 4 * c->r1 + 8 * c->r2);
    if (4ull * c->r1 + 8ull * c->r2 + 4ull * c->r3 > KVCXL_SLOT_OUT) {
        h->mismatch++;
        return;
    }
    for (uint32_t k = 0; k < c->r1; k++) {
        uint32_t id = adm[k];
        if (id >= h->n || h->slot_of[id] >= 0 || h->n_free == 0) {
            h->mismatch++;
            continue;
        }
        h->slot_of[id] = h->free_slots[--h->n_free];
        if (!h->is_poisoned[id])
            dev_read(h->mem + (uint64_t)h->slot_of[id] * h->E,
                     dev + KVCXL_KV_BASE + (uint64_t)id * h->E, h->E);
        h->admitted++;
    }
    for (uint32_t k = 0; k < c->r2; k++) {
        uint32_t id = vic[k].entry;
        if (id >= h->n || h->slot_of[id] < 0) {
            h->mismatch++;
            continue;
        }
        h->free_slots[h->n_free++] = h->slot_of[id];
        h->slot_of[id] = -1;
        h->victims++;
        h->to_nvme += vic[k].tier == 3;
        for (int s = 0; s < 4; s++) {
            h->vhash ^= (id >> (8 * s)) & 0xff;
            h->vhash *= 1099511628211ull;
        }
    }
    for (uint32_t k = 0; k < c->r3; k++)
        if (hint[k] < h->n && !h->hinted[hint[k]]) {
            h->hinted[hint[k]] = 1;
            h->hints++;
        }
}

static int job_replay(void)
{
    struct kvcxl_trace_hdr th;
    dev_read(&th, dev + KVCXL_TRACE_BASE, sizeof th);
    if (th.magic != KVCXL_TRACE_MAGIC || th.version != 1)
        die(2, "agent_error", "no trace in the trace area (bad magic or version)");
    if (th.entry_bytes == 0 || th.entry_bytes % 64 ||
        KVCXL_KV_BASE + (uint64_t)th.n_entries * th.entry_bytes > dev_size ||
        th.hdr_bytes + (uint64_t)th.n_batches * sizeof(struct kvcxl_trace_batch) >
            KVCXL_TRACE_SIZE)
        die(2, "agent_error", "trace does not fit the device");
    const uint32_t E = th.entry_bytes, N = th.n_entries;
    struct kvcxl_trace_batch *batches = malloc(th.n_batches * sizeof *batches + 1);
    dev_read(batches, dev + KVCXL_TRACE_BASE + th.hdr_bytes, th.n_batches * sizeof *batches);

    /* Lay out the KV cache in device memory: every entry gets its byte pattern. */
    uint64_t t_layout = now_ns();
    uint8_t *scratch = malloc(E);
    for (uint32_t id = 0; id < N; id++) {
        fill(scratch, th.seed, id, E);
        dev_write(dev + KVCXL_KV_BASE + (uint64_t)id * E, scratch, E);
    }
    t_layout = now_ns() - t_layout;

    /* HBM stand-in: `capacity` entry slots in guest local memory. */
    /* A batch admits its misses before the firmware's victims leave: room for one
     * command's worth of entries above the capacity (a staging area). */
    const uint32_t cap = th.capacity ? th.capacity : 1;
    struct hbm h = {.n = N, .E = E, .cap = cap + KVCXL_SLOT_IN / 8, .seed = th.seed};
    h.vhash = 1469598103934665603ull; /* FNV-1a over victim ids, in order */
    h.mem = malloc((uint64_t)h.cap * E);
    h.slot_of = malloc((N + 1) * sizeof *h.slot_of);
    h.free_slots = malloc(h.cap * sizeof *h.free_slots);
    h.hinted = calloc(N + 1, 1);
    h.is_poisoned = calloc(N + 1, 1);
    for (uint32_t i = 0; i < N; i++) {
        h.slot_of[i] = -1;
        h.is_poisoned[i] = poisoned(KVCXL_KV_BASE + (uint64_t)i * E, E);
    }
    h.n_free = h.cap;
    for (uint32_t i = 0; i < h.cap; i++)
        h.free_slots[i] = (int32_t)(h.cap - 1 - i);

    struct kvcxl_cqe c;
    struct kvcxl_open op = {N, E, cap, th.block_tokens, base_gpa};
    if (call(KVCXL_OP_OPEN, 0, 0, 0, &op, sizeof op, 0, 0, &c))
        die(1, "agent_error", "OPEN refused by the firmware");
    uint64_t poisoned_entries = 0;
    for (int i = 0; i < n_poison; i++) {
        call(KVCXL_OP_POISON, 0, 0, 0, NULL, 0, poison[i].dpa, poison[i].len, &c);
        poisoned_entries += c.r0;
    }

    uint64_t recs = 0, hbm_hits = 0, cxl_reads = 0, bad = 0, hints_used = 0, poison_reads = 0;
    uint64_t fw_hits = 0, steps = 0, ring_ns = 0, cmds = 0, status_errors = 0, creates = 0;
    uint64_t t_said = now_ns();
    uint64_t t0 = now_ns();
    uint8_t *payload = malloc(KVCXL_SLOT_IN);
    static const uint16_t op_of[3] = {KVCXL_OP_CREATE, KVCXL_OP_ATTN, KVCXL_OP_CTX_LEN};
    static const uint32_t rec_bytes[3] = {sizeof(struct kvcxl_create_rec),
                                          sizeof(struct kvcxl_attn_rec),
                                          sizeof(struct kvcxl_ctx_len_rec)};
    for (uint32_t b = 0; b < th.n_batches; b++) {
        struct kvcxl_trace_batch *tb = &batches[b];
        if (tb->kind > 2 || (uint64_t)tb->count * rec_bytes[tb->kind] > KVCXL_SLOT_IN ||
            tb->offset + (uint64_t)tb->count * rec_bytes[tb->kind] > KVCXL_TRACE_SIZE)
            die(2, "agent_error", "trace batch out of bounds");
        uint32_t len = tb->count * rec_bytes[tb->kind];
        dev_read(payload, dev + KVCXL_TRACE_BASE + tb->offset, len);
        uint32_t local_hits = 0;
        if (tb->kind == KVCXL_EV_READ) {
            struct kvcxl_attn_rec *rec = (struct kvcxl_attn_rec *)payload;
            for (uint32_t r = 0; r < tb->count; r++) {
                uint32_t id = rec[r].entry;
                if (id >= N)
                    die(2, "agent_error", "trace entry id out of range");
                if (h.hinted[id]) {
                    hints_used++;
                    h.hinted[id] = 0;
                }
                if (h.slot_of[id] >= 0) { /* served from the HBM stand-in */
                    local_hits++;
                    hbm_hits++;
                    if (!h.is_poisoned[id])
                        bad += check(h.mem + (uint64_t)h.slot_of[id] * E, th.seed, id, E);
                } else if (h.is_poisoned[id]) {
                    poison_reads++; /* a poisoned line is not consumed */
                } else { /* read from CXL memory */
                    cxl_reads++;
                    dev_read(scratch, dev + KVCXL_KV_BASE + (uint64_t)id * E, E);
                    bad += check(scratch, th.seed, id, E);
                }
            }
            recs += tb->count;
        } else if (tb->kind == KVCXL_EV_CREATE) {
            creates += tb->count;
        }
        uint64_t tr = now_ns();
        uint16_t st = call(op_of[tb->kind], tb->step, tb->layer, tb->count, payload, len, 0, 0,
                           &c);
        ring_ns += now_ns() - tr;
        cmds++;
        if (st) {
            status_errors++;
        } else if (tb->kind != KVCXL_EV_CTX_LEN) {
            if (tb->kind == KVCXL_EV_READ) {
                fw_hits += c.r0;
                h.mismatch += c.r0 != local_hits;
            }
            apply(&h, &c, sq_tail - 1);
        }
        if (b + 1 == th.n_batches || batches[b + 1].step != tb->step) {
            tr = now_ns();
            status_errors += call(KVCXL_OP_END_STEP, tb->step, 0, 0, NULL, 0, b, 0, NULL) != 0;
            ring_ns += now_ns() - tr;
            cmds++;
            steps++;
            if (tr - t_said > PROGRESS_NS) { /* the host's stall watchdog hears a long replay */
                emit("progress", "\"job\":\"replay\",\"steps\":%llu,\"batches\":%u,\"of\":%u",
                     (unsigned long long)steps, b + 1, th.n_batches);
                t_said = tr;
            }
        }
    }
    double secs = (now_ns() - t0) / 1e9;
    emit("replay",
         "\"entries\":%u,\"entry_bytes\":%u,\"capacity\":%u,\"events\":%u,\"steps\":%llu,"
         "\"created\":%llu,\"reads\":%llu,\"hbm_hits\":%llu,\"firmware_hits\":%llu,"
         "\"cxl_reads\":%llu,\"cxl_read_bytes\":%llu,\"admitted\":%llu,\"victims\":%llu,"
         "\"victims_to_nvme\":%llu,\"victim_hash\":\"%016llx\",\"prefetch_hints\":%llu,"
         "\"prefetch_hints_used\":%llu,\"poisoned_entries\":%llu,\"poisoned_reads\":%llu,"
         "\"bad_bytes\":%llu,\"residency_mismatches\":%llu,\"ring_errors\":%llu,"
         "\"ring_commands\":%llu,\"ring_time_s\":%.6f,\"layout_s\":%.6f,\"replay_s\":%.6f,"
         "\"attn_records_per_s\":%.1f,\"ring_commands_per_s\":%.1f,\"heartbeat_gap_max_ms\":%.1f",
         N, E, cap, th.n_batches, (unsigned long long)steps, (unsigned long long)creates,
         (unsigned long long)recs, (unsigned long long)hbm_hits, (unsigned long long)fw_hits,
         (unsigned long long)cxl_reads, (unsigned long long)(cxl_reads * E),
         (unsigned long long)h.admitted, (unsigned long long)h.victims,
         (unsigned long long)h.to_nvme, (unsigned long long)h.vhash,
         (unsigned long long)h.hints, (unsigned long long)hints_used,
         (unsigned long long)poisoned_entries, (unsigned long long)poison_reads,
         (unsigned long long)bad, (unsigned long long)h.mismatch,
         (unsigned long long)status_errors, (unsigned long long)cmds, ring_ns / 1e9,
         t_layout / 1e9, secs, ring_ns ? recs / (ring_ns / 1e9) : 0.0,
         ring_ns ? cmds / (ring_ns / 1e9) : 0.0, gap_max_ns / 1e6);
    call(KVCXL_OP_CLOSE, 0, 0, 0, NULL, 0, 0, 0, NULL);
    return (bad || h.mismatch || status_errors) ? 1 : 0;
}

/* Malformed commands must get error completions, and the ring must keep working. */
static int job_malformed(void)
{
    struct kvcxl_attn_rec r[2] = {{0, 0.5f}, {0, 0.25f}};
    struct kvcxl_trace_hdr th;
    dev_read(&th, dev + KVCXL_TRACE_BASE, sizeof th);
    uint32_t n = th.magic == KVCXL_TRACE_MAGIC ? th.n_entries : 1;
    uint16_t s_op = call(0x1234, 0, 0, 0, NULL, 0, 0, 0, NULL);
    uint16_t s_early = call(KVCXL_OP_ATTN, 0, 0, 2, r, sizeof r, 0, 0, NULL);
    struct kvcxl_open op = {(uint32_t)(dev_size / 64), 64, 4, 16, base_gpa}; /* too many */
    uint16_t s_open = call(KVCXL_OP_OPEN, 0, 0, 0, &op, sizeof op, 0, 0, NULL);
    op.n_entries = n;
    uint16_t s_ok = call(KVCXL_OP_OPEN, 0, 0, 0, &op, sizeof op, 0, 0, NULL);
    struct kvcxl_create_rec cr = {0, 0, 0, 0, 0};
    uint16_t s_create = call(KVCXL_OP_CREATE, 0, 0, 1, &cr, sizeof cr, 0, 0, NULL);
    uint16_t s_len = call(KVCXL_OP_ATTN, 0, 0, 5000, r, sizeof r, 0, 0, NULL);
    uint16_t s_short = call(KVCXL_OP_ATTN, 0, 0, 2, r, 12, 0, 0, NULL);
    r[1].entry = 0xfffffff0u;
    uint16_t s_id = call(KVCXL_OP_ATTN, 0, 0, 2, r, sizeof r, 0, 0, NULL);
    r[1].entry = 0;
    r[1].weight = NAN;
    uint16_t s_nan = call(KVCXL_OP_ATTN, 0, 0, 2, r, sizeof r, 0, 0, NULL);
    uint16_t s_nop = call(KVCXL_OP_NOP, 0, 0, 0, NULL, 0, 42, 0, NULL);
    call(KVCXL_OP_CLOSE, 0, 0, 0, NULL, 0, 0, 0, NULL);
    emit("malformed",
         "\"unknown_opcode\":%u,\"attn_before_open\":%u,\"open_too_big\":%u,\"open\":%u,"
         "\"create\":%u,\"count_too_large\":%u,\"short_payload\":%u,"
         "\"entry_out_of_range\":%u,\"nan_weight\":%u,\"nop_after\":%u",
         s_op, s_early, s_open, s_ok, s_create, s_len, s_short, s_id, s_nan, s_nop);
    return 0;
}

/* The host's mutated ring commands (the fuzz area, qemu/guest_fuzz.py), submitted from
 * the guest one at a time; each result (status, out_len, stray bytes) goes back to the
 * fuzz area for the host to compare with its model.  Stray bytes: a changed byte of the
 * submission or completion queues other than this command's completion, or of its
 * output slot past out_len (filled with a sentinel before the command); and, once at the
 * end, of a 64 KiB pattern at the start of KV space. */
#define FUZZ_SENTINEL 0xa5u
#define SEED_KV 0x4b56465au
static int job_fuzz(void)
{
    struct kvcxl_fuzz_hdr fh;
    dev_read(&fh, dev + KVCXL_FUZZ_BASE, sizeof fh);
    const uint64_t case_end = fh.hdr_bytes + (uint64_t)fh.n_cases * sizeof(struct kvcxl_fuzz_case);
    if (fh.magic != KVCXL_FUZZ_MAGIC || case_end > KVCXL_FUZZ_SIZE ||
        fh.results + (uint64_t)fh.n_cases * sizeof(struct kvcxl_fuzz_result) > KVCXL_FUZZ_SIZE)
        die(2, "agent_error", "no fuzz cases in the fuzz area");
    const uint64_t KV_GUARD = 64 << 10;
    uint8_t *payload = malloc(KVCXL_SLOT_IN), *sentinel = malloc(KVCXL_SLOT_OUT);
    uint8_t *guard = malloc(KV_GUARD), *out = malloc(KVCXL_SLOT_OUT);
    fill(guard, SEED_KV, 0, KV_GUARD);
    dev_write(dev + KVCXL_KV_BASE, guard, KV_GUARD);
    memset(sentinel, FUZZ_SENTINEL, KVCXL_SLOT_OUT);
    static uint8_t q_before[KVCXL_SLOTS - KVCXL_SQ], q_after[KVCXL_SLOTS - KVCXL_SQ];
    uint64_t stray_total = 0, internal = 0, t0 = now_ns();
    for (uint32_t k = 0; k < fh.n_cases; k++) {
        struct kvcxl_fuzz_case fc;
        dev_read(&fc, dev + KVCXL_FUZZ_BASE + fh.hdr_bytes + (uint64_t)k * sizeof fc, sizeof fc);
        if (fc.length > KVCXL_SLOT_IN || fc.offset + (uint64_t)fc.length > KVCXL_FUZZ_SIZE)
            die(2, "agent_error", "fuzz case payload out of bounds");
        dev_read(payload, dev + KVCXL_FUZZ_BASE + fc.offset, fc.length);
        uint32_t i = sq_tail;
        dev_write(slot_out(i), sentinel, KVCXL_SLOT_OUT);
        dev_write(slot_in(i), payload, fc.length);
        volatile struct kvcxl_sqe *e = sqe_at(i);
        e->opcode = fc.op;
        e->flags = 0;
        e->cid = next_cid++;
        e->step = fc.step;
        e->layer = 0;
        e->count = fc.count;
        e->in_len = fc.in_len;
        e->arg0 = fc.arg0;
        e->arg1 = fc.arg1;
        __sync_synchronize();
        dev_read(q_before, dev + KVCXL_RING_BASE + KVCXL_SQ, sizeof q_before);
        sq_tail = i + 1;
        hhdr()->sq_tail = sq_tail; /* the doorbell */
        volatile struct kvcxl_cqe *c = wait_cqe(i);
        struct kvcxl_fuzz_result r = {c->status, 1, c->out_len, 0, 0};
        dev_read(q_after, dev + KVCXL_RING_BASE + KVCXL_SQ, sizeof q_after);
        const uint64_t own = KVCXL_CQ - KVCXL_SQ + (uint64_t)(i % KVCXL_DEPTH) * KVCXL_ENTRY;
        for (uint64_t b = 0; b < sizeof q_after; b++)
            r.stray += q_before[b] != q_after[b] && (b < own || b >= own + KVCXL_ENTRY);
        if (r.out_len > KVCXL_SLOT_OUT) {
            r.stray += 1;
        } else {
            dev_read(out, slot_out(i), KVCXL_SLOT_OUT);
            for (uint32_t b = r.out_len; b < KVCXL_SLOT_OUT; b++)
                r.stray += out[b] != FUZZ_SENTINEL;
        }
        consume(i);
        internal += r.status == KVCXL_RC_INTERNAL;
        stray_total += r.stray;
        dev_write(dev + KVCXL_FUZZ_BASE + fh.results + (uint64_t)k * sizeof r, &r, sizeof r);
    }
    dev_read(guard, dev + KVCXL_KV_BASE, KV_GUARD);
    uint64_t kv_bad = check(guard, SEED_KV, 0, KV_GUARD);
    __sync_synchronize();
    emit("fuzz",
         "\"cases\":%u,\"internal_errors\":%llu,\"stray_bytes\":%llu,\"kv_guard_bad\":%llu,"
         "\"fuzz_s\":%.3f",
         fh.n_cases, (unsigned long long)internal, (unsigned long long)stray_total,
         (unsigned long long)kv_bad, (now_ns() - t0) / 1e9);
    call(KVCXL_OP_CLOSE, 0, 0, 0, NULL, 0, 0, 0, NULL);
    return (internal || stray_total || kv_bad) ? 1 : 0;
}

/* Loads and stores of every width the guest's CPU makes (1, 2, 4, 8 bytes; 16: one SSE
 * access; 64: a line as four SSE accesses, TCG having no wider one) at random offsets of
 * the widths area, aligned or not, a third of them straddling a page boundary
 * (where the host's --trap and --churn ranges meet direct pages).  Every load is compared
 * with a shadow copy in guest RAM; the shadow's FNV-1a hash is reported for the host to
 * compare with the device's bytes.  widths_in_line: the same, no access crossing a 64-byte
 * line (the unit of a CXL.mem request). */
#define WIDTH_OPS 40000
static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static void width_store(volatile uint8_t *p, const uint8_t *v, unsigned w)
{
    switch (w) {
    case 1: *p = v[0]; break;
    case 2: { uint16_t x; memcpy(&x, v, 2); *(volatile uint16_t *)p = x; } break;
    case 4: { uint32_t x; memcpy(&x, v, 4); *(volatile uint32_t *)p = x; } break;
    case 8: { uint64_t x; memcpy(&x, v, 8); *(volatile uint64_t *)p = x; } break;
    default:
        for (unsigned k = 0; k < w; k += 16)
            _mm_storeu_si128((__m128i *)(p + k), _mm_loadu_si128((const __m128i *)(v + k)));
    }
}
static void width_load(const volatile uint8_t *p, uint8_t *v, unsigned w)
{
    switch (w) {
    case 1: v[0] = *p; break;
    case 2: { uint16_t x = *(const volatile uint16_t *)p; memcpy(v, &x, 2); } break;
    case 4: { uint32_t x = *(const volatile uint32_t *)p; memcpy(v, &x, 4); } break;
    case 8: { uint64_t x = *(const volatile uint64_t *)p; memcpy(v, &x, 8); } break;
    default:
        for (unsigned k = 0; k < w; k += 16)
            _mm_storeu_si128((__m128i *)(v + k), _mm_loadu_si128((const __m128i *)(p + k)));
    }
}
static int job_widths(int in_line)
{
    static const unsigned widths[6] = {1, 2, 4, 8, 16, 64};
    const uint64_t N = KVCXL_WIDTHS_BYTES;
    volatile uint8_t *region = dev + KVCXL_WIDTHS_BASE;
    uint8_t *shadow = malloc(N);
    dev_read(shadow, (const uint8_t *)region, N);
    uint64_t seed = 0x9e3779b97f4a7c15ull, loads = 0, stores = 0, bad = 0, straddles = 0;
    uint64_t per_width[6] = {0}, bad_by_width[6] = {0}, first_bad_off[6] = {0};
    uint64_t first_bad_op[6] = {0};
    uint8_t v[64], got[64];
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < WIDTH_OPS; i++) {
        uint64_t r = xorshift(&seed);
        unsigned wi = r % 6, w = widths[wi];
        uint64_t off;
        if ((r >> 8) % 3 == 0) { /* across a page boundary */
            uint64_t page = 1 + (r >> 16) % (N / 4096 - 1);
            off = page * 4096 - 1 - (r >> 32) % w;
            if (w == 1)
                off = page * 4096 - (r >> 32) % 2;
        } else {
            off = (r >> 16) % (N - w + 1);
        }
        if (in_line && off / 64 != (off + w - 1) / 64) /* keep it inside its 64-byte line */
            off = w == 64 ? off & ~63ull : (off & ~63ull) + (off & 63) % (64 - w + 1);
        straddles += off / 4096 != (off + w - 1) / 4096;
        per_width[wi]++;
        if ((r >> 40) & 1) {
            for (unsigned k = 0; k < w; k++)
                v[k] = (uint8_t)(xorshift(&seed) >> 24);
            width_store(region + off, v, w);
            memcpy(shadow + off, v, w);
            stores++;
        } else {
            width_load(region + off, got, w);
            uint64_t b = 0;
            for (unsigned k = 0; k < w; k++)
                b += got[k] != shadow[off + k];
            if (b && !bad_by_width[wi]) { /* the first wrong load of each width */
                first_bad_off[wi] = off;
                first_bad_op[wi] = i;
            }
            bad_by_width[wi] += b;
            bad += b;
            loads++;
        }
    }
    /* a final sweep: every byte as the guest last wrote it */
    uint8_t *sweep = malloc(N);
    dev_read(sweep, (const uint8_t *)region, N);
    for (uint64_t k = 0; k < N; k++)
        bad += sweep[k] != shadow[k];
    uint64_t h = 1469598103934665603ull;
    for (uint64_t k = 0; k < N; k++) {
        h ^= shadow[k];
        h *= 1099511628211ull;
    }
    __sync_synchronize();
    for (unsigned wi = 0; wi < 6; wi++)
        if (bad_by_width[wi])
            emit("widths_bad", "\"in_line\":%d,\"width\":%u,\"bad_bytes\":%llu,\"first_offset\":%llu,"
                 "\"first_op\":%llu", in_line, widths[wi], (unsigned long long)bad_by_width[wi],
                 (unsigned long long)first_bad_off[wi], (unsigned long long)first_bad_op[wi]);
    emit(in_line ? "widths_in_line" : "widths",
         "\"ops\":%llu,\"loads\":%llu,\"stores\":%llu,\"straddling\":%llu,\"bad_bytes\":%llu,"
         "\"w1\":%llu,\"w2\":%llu,\"w4\":%llu,\"w8\":%llu,\"w16\":%llu,\"w64\":%llu,"
         "\"region\":\"0x%llx\",\"bytes\":%llu,\"shadow_fnv\":\"%016llx\",\"widths_s\":%.3f",
         (unsigned long long)WIDTH_OPS, (unsigned long long)loads, (unsigned long long)stores,
         (unsigned long long)straddles, (unsigned long long)bad,
         (unsigned long long)per_width[0], (unsigned long long)per_width[1],
         (unsigned long long)per_width[2], (unsigned long long)per_width[3],
         (unsigned long long)per_width[4], (unsigned long long)per_width[5],
         (unsigned long long)KVCXL_WIDTHS_BASE, (unsigned long long)N, (unsigned long long)h,
         (now_ns() - t0) / 1e9);
    free(shadow);
    free(sweep);
    return bad ? 1 : 0;
}

static double memcpy_mbps(uint8_t *dst, const uint8_t *src, uint64_t bytes, int reps)
{
    uint64_t t = now_ns();
    for (int i = 0; i < reps; i++)
        memcpy(dst, src, bytes);
    __sync_synchronize();
    return bytes * (double)reps / ((now_ns() - t) / 1e9) / 1e6;
}

/* Latency of single 8-byte loads at random lines of one region, each timed alone:
 * percentiles in ns and loads/s.  The bench boot traps the widths area on the patched
 * QEMU (every access is a CXL.mem request to the device: the slow path that NVMe-tier
 * and poisoned pages take) and leaves the block at the device's end direct. */
static void load_latency(volatile uint8_t *region, uint64_t bytes, uint64_t *ns, int n,
                         double *p50, double *p95, double *p99, double *per_s)
{
    uint64_t seed = 0x9e3779b97f4a7c15ull, sink = 0;
    uint64_t t0 = now_ns();
    for (int i = 0; i < n; i++) {
        uint64_t off = (xorshift(&seed) % (bytes / 64)) * 64;
        uint64_t t = now_ns();
        sink += *(volatile uint64_t *)(region + off);
        ns[i] = now_ns() - t;
    }
    double total = (now_ns() - t0) / 1e9;
    __sync_synchronize();
    (void)sink;
    qsort(ns, n, sizeof ns[0], cmp_u64);
    *p50 = ns[n / 2];
    *p95 = ns[n * 95 / 100];
    *p99 = ns[n * 99 / 100];
    *per_s = n / total;
}

static int job_bench(void)
{
    enum { RTT_N = 200, BURST = 2000 };
    static uint64_t rtt[RTT_N];
    for (int i = 0; i < RTT_N; i++) {
        uint64_t t = now_ns();
        call(KVCXL_OP_NOP, 0, 0, 0, NULL, 0, i, 0, NULL);
        rtt[i] = now_ns() - t;
    }
    qsort(rtt, RTT_N, sizeof rtt[0], cmp_u64);
    /* Pipelined NOPs: batches of up to DEPTH commands, one doorbell per batch. */
    uint64_t t = now_ns();
    uint32_t first = sq_tail, done = 0, sent = 0;
    while (done < BURST) {
        while (sent < BURST && sq_tail - cq_head < KVCXL_DEPTH) {
            enqueue(KVCXL_OP_NOP, 0, 0, 0, NULL, 0, sent, 0);
            sent++;
        }
        ring();
        while (done < sent)
            wait_cqe(first + done++);
        consume(first + done - 1); /* the batch's completions in one write of cq_head */
    }
    double cps = BURST / ((now_ns() - t) / 1e9);
    /* memcpy into device memory (its last block, above the KV area) vs guest RAM. */
    const uint64_t B = KVCXL_BENCH_BYTES;
    uint8_t *a = malloc(B), *b = malloc(B);
    memset(a, 0x5a, B);
    memset(b, 0xa5, B);
    uint8_t *cxl = dev + dev_size - B;
    double ram = memcpy_mbps(b, a, B, 20);
    double to_cxl = memcpy_mbps(cxl, a, B, 1);
    double from_cxl = memcpy_mbps(b, cxl, B, 1);
    /* Above 200 MB/s (the MMIO paths reach about 70) the pages are mapped as guest RAM
     * (--alias): one copy is then ~1 ms and mostly first touches, so measure as guest
     * RAM is measured, 20 copies. */
    if (to_cxl > 200.0 && from_cxl > 200.0) {
        to_cxl = memcpy_mbps(cxl, a, B, 20);
        from_cxl = memcpy_mbps(b, cxl, B, 20);
    }
    uint64_t t1 = now_ns();
    dev_write(cxl, a, B);
    double w_to = B / ((now_ns() - t1) / 1e9) / 1e6;
    t1 = now_ns();
    dev_read(b, cxl, B);
    double w_from = B / ((now_ns() - t1) / 1e9) / 1e6;
    enum { LOADS = 4000 };
    static uint64_t lat[LOADS];
    double s50, s95, s99, sps, d50, d95, d99, dps;
    load_latency(dev + KVCXL_WIDTHS_BASE, KVCXL_WIDTHS_BYTES, lat, LOADS, &s50, &s95, &s99,
                 &sps);
    load_latency(cxl, B, lat, LOADS, &d50, &d95, &d99, &dps);
    emit("bench",
         "\"ring_rtt_us_p50\":%.1f,\"ring_rtt_us_p99\":%.1f,\"ring_rtt_us_min\":%.1f,"
         "\"ring_commands_per_s\":%.0f,\"memcpy_ram_MBps\":%.1f,\"memcpy_to_cxl_MBps\":%.1f,"
         "\"memcpy_from_cxl_MBps\":%.1f,\"copy64_to_cxl_MBps\":%.1f,"
         "\"copy64_from_cxl_MBps\":%.1f,\"memcpy_block_bytes\":%llu,"
         "\"widths_area_load_ns_p50\":%.0f,\"widths_area_load_ns_p95\":%.0f,"
         "\"widths_area_load_ns_p99\":%.0f,\"widths_area_loads_per_s\":%.0f,"
         "\"end_block_load_ns_p50\":%.0f,\"end_block_load_ns_p95\":%.0f,"
         "\"end_block_load_ns_p99\":%.0f,\"end_block_loads_per_s\":%.0f,"
         "\"heartbeat_gap_max_ms\":%.1f",
         rtt[RTT_N / 2] / 1e3, rtt[RTT_N * 99 / 100] / 1e3, rtt[0] / 1e3, cps, ram, to_cxl,
         from_cxl, w_to, w_from, (unsigned long long)B, s50, s95, s99, sps, d50, d95, d99,
         dps, gap_max_ns / 1e6);
    call(KVCXL_OP_CLOSE, 0, 0, 0, NULL, 0, 0, 0, NULL);
    return 0;
}

static uint64_t dax_size(const char *path)
{
    char sys[256];
    const char *name = strrchr(path, '/');
    snprintf(sys, sizeof sys, "/sys/bus/dax/devices/%s/size", name ? name + 1 : path);
    FILE *f = fopen(sys, "r");
    unsigned long long v = 0;
    if (!f || fscanf(f, "%llu", &v) != 1)
        v = 0;
    if (f)
        fclose(f);
    return v;
}

static void parse_poison(char *s)
{
    for (char *tok = strtok(s, ","); tok && n_poison < MAX_POISON; tok = strtok(NULL, ",")) {
        char *colon = strchr(tok, ':');
        if (!colon)
            continue;
        poison[n_poison].dpa = strtoull(tok, NULL, 0);
        poison[n_poison].len = strtoull(colon + 1, NULL, 0);
        /* The kernel reports lengths in bytes (multiples of 64). */
        n_poison++;
    }
}

int main(int argc, char **argv)
{
    const char *path = "/dev/dax0.0", *job = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dax") && i + 1 < argc)
            path = argv[++i];
        else if (!strcmp(argv[i], "--base") && i + 1 < argc)
            base_gpa = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--poison") && i + 1 < argc)
            parse_poison(argv[++i]);
        else if (!strcmp(argv[i], "--heartbeat-ms") && i + 1 < argc && atoll(argv[i + 1]) > 0)
            silence_ns = strtoull(argv[++i], NULL, 0) * 1000000ull;
        else if (argv[i][0] != '-' && !job)
            job = argv[i];
        else
            die(2, "agent_error",
                "usage: kvcxl-agent [--dax P] [--base GPA] [--poison L] [--heartbeat-ms MS] JOB");
    }
    if (!job)
        die(2, "agent_error", "no job given (datapath, replay, malformed, fuzz, widths, bench)");
    dev_size = dax_size(path);
    int fd = open(path, O_RDWR);
    if (fd < 0 || dev_size == 0)
        die(2, "agent_error", "cannot open the DAX device");
    dev = mmap(NULL, dev_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (dev == MAP_FAILED)
        die(2, "agent_error", "cannot map the DAX device");
    emit("agent_start", "\"job\":\"%s\",\"dax_bytes\":%llu,\"poison_ranges\":%d", job,
         (unsigned long long)dev_size, n_poison);
    if (!strcmp(job, "datapath"))
        return job_datapath();
    if (!strcmp(job, "widths"))
        return job_widths(0);
    if (!strcmp(job, "widths_in_line"))
        return job_widths(1);
    ring_wait_ready();
    wait_tracing();
    if (!strcmp(job, "replay"))
        return job_replay();
    if (!strcmp(job, "malformed"))
        return job_malformed();
    if (!strcmp(job, "fuzz"))
        return job_fuzz();
    if (!strcmp(job, "bench"))
        return job_bench();
    die(2, "agent_error", "unknown job");
    return 2;
}
