/* The kvcxl device-memory protocol, guest side.  The Python side is kvcxl/cxl/ring.py;
 * docs/qemu.md describes both.  All fields are little-endian; offsets are device
 * physical addresses (DPA) = offsets into /dev/dax0.0 = offsets into the media file. */
#ifndef KVCXL_RING_H
#define KVCXL_RING_H

#include <stdint.h>

/* --- DPA map ----------------------------------------------------------------------- */
#define KVCXL_RING_BASE 0x000000ull   /* command/completion ring, 1 MiB */
#define KVCXL_TRACE_BASE 0x100000ull  /* trace written by the host, 7 MiB */
#define KVCXL_TRACE_SIZE 0x700000ull
#define KVCXL_XFER_BASE 0x800000ull   /* data-path check area, 8 MiB */
#define KVCXL_XFER_H2G (KVCXL_XFER_BASE)            /* host writes, guest reads */
#define KVCXL_XFER_G2H (KVCXL_XFER_BASE + 0x400000) /* guest writes, host reads */
#define KVCXL_XFER_BYTES 0x10000ull                 /* 64 KiB each way */
#define KVCXL_FUZZ_BASE (KVCXL_XFER_BASE + 0x100000) /* fuzz cases and results, 3 MiB */
#define KVCXL_FUZZ_SIZE 0x300000ull
#define KVCXL_WIDTHS_BASE (KVCXL_XFER_G2H + 0x100000) /* the widths job's 64 KiB */
#define KVCXL_WIDTHS_BYTES 0x10000ull
#define KVCXL_KV_BASE 0x1000000ull                  /* KV entries from 16 MiB */
#define KVCXL_BENCH_BYTES 0x400000ull /* the bench job's copy block: the device's last 4 MiB */

/* --- ring geometry (offsets from KVCXL_RING_BASE) ----------------------------------- */
#define KVCXL_RING_MAGIC 0x5152434bu /* "KCRQ" */
#define KVCXL_RING_VERSION 1
#define KVCXL_DEV_HDR 0x0000u   /* device-written line */
#define KVCXL_HOST_HDR 0x0040u  /* guest-written line: doorbell */
#define KVCXL_SQ 0x1000u
#define KVCXL_CQ 0x2000u
#define KVCXL_SLOTS 0x4000u
#define KVCXL_DEPTH 32u
#define KVCXL_ENTRY 64u
#define KVCXL_SLOT_IN 8192u  /* command payload bytes per slot */
#define KVCXL_SLOT_OUT 16384u /* response bytes per slot */
#define KVCXL_SLOT_STRIDE (KVCXL_SLOT_IN + KVCXL_SLOT_OUT)

/* device status */
#define KVCXL_DEV_OFF 0u
#define KVCXL_DEV_READY 1u
#define KVCXL_DEV_FAULT 2u
#define KVCXL_DEV_STOPPED 3u

struct kvcxl_dev_hdr { /* written by the firmware service only */
    uint32_t magic;
    uint16_t version;
    uint16_t depth;
    uint32_t slot_in;
    uint32_t slot_out;
    uint32_t status;
    uint32_t sq_head;   /* commands consumed (free-running) */
    uint64_t heartbeat; /* incremented at least every 10 ms while the service runs */
    uint32_t errors;    /* completions with a non-zero status */
    uint32_t tracing;   /* TCG plugin: 0 none, 1 arming, 2 recording CXL-window accesses */
    uint32_t reserved[6];
};

struct kvcxl_host_hdr { /* written by the guest only */
    uint32_t sq_tail; /* doorbell: commands submitted (free-running) */
    uint32_t cq_head; /* completions consumed (free-running) */
    uint32_t reserved[14];
};

/* opcodes: the table is RING_COMMANDS in kvcxl/cxl/ring.py (tests/test_qemu_ring.py
 * compiles this header and compares).  Commands that mean what a mailbox vendor command
 * means share its opcode and input records (cxl/mailbox.py, docs/device.md);
 * ring-only commands use command set C1h, which the mailbox does not use. */
#define KVCXL_OP_NOP 0xC100u
#define KVCXL_OP_OPEN 0xC101u
#define KVCXL_OP_CREATE 0xC102u   /* = Describe Entries (C005h) + Create Entries (C007h) */
#define KVCXL_OP_END_STEP 0xC103u
#define KVCXL_OP_POISON 0xC104u
#define KVCXL_OP_CLOSE 0xC105u
#define KVCXL_OP_ATTN 0xC002u     /* = mailbox Attention Report */
#define KVCXL_OP_STATS 0xC003u    /* = mailbox Get Statistics */
#define KVCXL_OP_CTX_LEN 0xC006u  /* = mailbox Set Context Lengths */

/* return codes: those of the CXL mailbox (CXL 3.x table 8-34) */
#define KVCXL_RC_SUCCESS 0x0000u
#define KVCXL_RC_INVALID_INPUT 0x0002u
#define KVCXL_RC_UNSUPPORTED 0x0003u
#define KVCXL_RC_INTERNAL 0x0004u
#define KVCXL_RC_INVALID_PAYLOAD_LENGTH 0x0016u

struct kvcxl_sqe {
    uint16_t opcode;
    uint16_t flags;
    uint32_t cid;
    uint32_t step;
    uint32_t layer;
    uint32_t count; /* records in the slot's input buffer */
    uint32_t in_len; /* bytes used in the slot's input buffer */
    uint64_t arg0;
    uint64_t arg1;
    uint32_t reserved[6];
};

struct kvcxl_cqe {
    uint32_t cid;
    uint16_t status;
    uint16_t opcode;
    uint32_t sq_head;
    uint32_t out_len; /* bytes written in the slot's output buffer */
    uint32_t r0, r1, r2, r3;
    uint64_t r4;
    uint32_t reserved[5];
    uint32_t seq; /* written last: completion number + 1 (free-running) */
};

/* ATTN input record = the mailbox's Attention Report record.  Weights are f32: the
 * trace holds them as f32 and the firmware widens them on reading. */
struct kvcxl_attn_rec {
    uint32_t entry;
    float weight;
};

/* OPEN input */
struct kvcxl_open {
    uint32_t n_entries;    /* KV entries the host will create, at most */
    uint32_t entry_bytes;  /* bytes per entry, a multiple of 64 */
    uint32_t capacity;     /* HBM entries the firmware may keep resident */
    uint32_t block_tokens; /* tokens per KV block */
    uint64_t window_base;  /* guest physical address of DPA 0 */
};

/* CREATE input record = the mailbox's Describe Entries record: a new entry (written to
 * HBM by the host) */
struct kvcxl_create_rec {
    uint32_t entry; /* must be the next dense id */
    uint32_t ctx;
    uint16_t layer;
    uint16_t head;
    uint32_t block;
};

/* CTX_LEN input record = the mailbox's Set Context Lengths record: a context's length in
 * tokens (12 bytes, packed) */
struct __attribute__((packed)) kvcxl_ctx_len_rec {
    uint32_t ctx;
    uint64_t tokens;
};

/* ATTN and CREATE output: r1 admitted ids (u32), r2 victims, r3 prefetch hints (u32). */
struct kvcxl_victim {
    uint32_t entry;
    uint16_t tier;         /* placement of the evicted entry: 2 CXL DRAM, 3 NVMe */
    uint16_t priority_q16; /* eviction priority, Q0.16 */
};

/* --- trace area (written by the host before boot) ------------------------------------ */
#define KVCXL_TRACE_MAGIC 0x5254564bu /* "KVTR" */
struct kvcxl_trace_hdr {
    uint32_t magic;
    uint16_t version;
    uint16_t hdr_bytes;
    uint32_t n_entries;
    uint32_t n_batches;
    uint32_t entry_bytes;
    uint32_t capacity; /* HBM stand-in capacity in entries */
    uint32_t n_records;
    uint32_t seed;    /* of the entries' byte pattern */
    uint32_t block_tokens;
    uint32_t reserved[7];
};
#define KVCXL_EV_CREATE 0u  /* records: kvcxl_create_rec */
#define KVCXL_EV_READ 1u    /* records: kvcxl_attn_rec */
#define KVCXL_EV_CTX_LEN 2u /* records: kvcxl_ctx_len_rec */
struct kvcxl_trace_batch {
    uint32_t step;
    uint16_t layer;
    uint16_t kind;
    uint32_t count;
    uint32_t offset; /* of its records, from KVCXL_TRACE_BASE */
};

/* --- guest fuzz area (written by the host before boot; results by the fuzz job) ------- */
#define KVCXL_FUZZ_MAGIC 0x5a46564bu /* "KVFZ" */
struct kvcxl_fuzz_hdr {
    uint32_t magic;
    uint32_t n_cases;
    uint32_t hdr_bytes; /* the cases follow the header */
    uint32_t results;   /* offset of the results, from KVCXL_FUZZ_BASE */
    uint32_t reserved[12];
};
struct kvcxl_fuzz_case {
    uint16_t op;
    uint16_t pad;
    uint32_t step;
    uint32_t count;
    uint32_t in_len; /* as submitted; may be past the slot */
    uint64_t arg0;
    uint64_t arg1;
    uint32_t offset; /* of the payload, from KVCXL_FUZZ_BASE */
    uint32_t length; /* payload bytes written to the input slot */
};
struct kvcxl_fuzz_result {
    uint16_t status;
    uint16_t done; /* 1 once the case completed */
    uint32_t out_len;
    uint32_t stray; /* bytes changed outside the completion and the out_len output bytes */
    uint32_t pad;
};

_Static_assert(sizeof(struct kvcxl_fuzz_hdr) == 64, "fuzz hdr");
_Static_assert(sizeof(struct kvcxl_dev_hdr) == 64, "dev hdr");
_Static_assert(sizeof(struct kvcxl_host_hdr) == 64, "host hdr");
_Static_assert(sizeof(struct kvcxl_sqe) == 64, "sqe");
_Static_assert(sizeof(struct kvcxl_cqe) == 64, "cqe");
_Static_assert(sizeof(struct kvcxl_trace_hdr) == 64, "trace hdr");
_Static_assert(sizeof(struct kvcxl_open) == 24, "open");
_Static_assert(sizeof(struct kvcxl_create_rec) == 16, "create rec");
_Static_assert(sizeof(struct kvcxl_attn_rec) == 8, "attn rec");
_Static_assert(sizeof(struct kvcxl_ctx_len_rec) == 12, "ctx len rec");

/* Byte pattern of KV entry `id` (and of the data-path areas): 64-bit word k. */
static inline uint64_t kvcxl_pattern(uint32_t seed, uint32_t id, uint64_t k)
{
    uint64_t z = ((uint64_t)seed << 32 | id) * 0x9e3779b97f4a7c15ull + k * 0xd1b54a32d192ed03ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* --- TCG plugin access ring (a shared-memory file, not device memory) ---------------- */
#define KVCXL_ACC_MAGIC 0x4343414bu /* "KACC" */
struct kvcxl_acc_hdr {
    uint32_t magic;
    uint32_t capacity; /* records, a power of two */
    uint64_t head;     /* written by the plugin (free-running) */
    uint64_t tail;     /* written by the service (free-running) */
    uint64_t dropped;  /* records lost to a full ring */
    uint64_t seen;     /* CXL-window accesses seen */
    uint64_t armed;    /* 1: the service asks (first ring command); 2: plugin recording */
    uint64_t reserved[2];
};
struct kvcxl_acc_rec {
    uint64_t gpa;
    uint32_t size_flags; /* bits 0-15 size in bytes, bit 16 store */
    uint32_t vcpu;
};
_Static_assert(sizeof(struct kvcxl_acc_hdr) == 64, "acc hdr");

#endif
