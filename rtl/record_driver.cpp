// The host side of the Verilated RecordStreamEngine (records in device DRAM) and the DRAM
// behind its memory port: one C++ loop clocks the engine, offers its `upd` beats and
// serves its burst reads and writes from a model of the device's DRAM.
//
// Built into a shared library by kvcxl.rtl.verilated_records (which generates
// record_layout.h: the wrapper's Verilated class and the bit offsets of every payload
// field, from rtl/layouts.py and rtl/record_stream.py) and called through ctypes. The
// clock, timers, handshake and payload packing are rtl/harness.h's.
//
// The DRAM model is tb/record_stream_model.py's `Dram`, cycle for cycle: up to `depth`
// burst commands queued per direction; a read burst's first word offered `latency` cycles
// after its command was taken, the rest in order; reads and writes share `bytes_per_cycle`
// (a word costs its bits / 8; unused bandwidth banks at most two words; when only one word
// fits, reads and writes take turns). It holds one word per `lanes` entries of the trace.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "record_layout.h"
#include "harness.h"

namespace {

constexpr int WW = std::max(2, (WORD_BITS + 31) / 32);  // 32-bit words in a memory word

// Defects of the DRAM model (the whole-trace check must catch them): kStaleRead answers
// the first word of every read burst with the word it delivered before (a stale read
// buffer: that word's LANES records are the previous word's).
enum Defect { kNone = 0, kStaleRead = 1 };

struct Burst {
    uint32_t addr, left;
    uint64_t start;  // the cycle its first word may be offered (reads)
    bool first;      // no word of it has moved yet
};

struct Dram {
    std::vector<uint32_t> mem;  // words × WW
    uint32_t words = 0;
    uint32_t latency = 20, depth = 4;
    double word_bytes = WORD_BITS / 8.0, bpc = 0, cap = 0, tokens = 0;
    std::deque<Burst> rq, wq;
    uint64_t now = 0, reads = 0, writes = 0;
    int turn = 0, defect = kNone;
    uint32_t last[WW] = {};  // the word a read delivered last (kStaleRead)
    uint32_t* at(uint32_t a) { return &mem[size_t(a) * WW]; }
    // The word a read of the head burst offers.
    const uint32_t* read_word() {
        const Burst& b = rq.front();
        return defect == kStaleRead && b.first ? last : at(b.addr);
    }
};

struct RecordHarness : Harness {
    Dram dram;
    std::vector<uint32_t> upd;  // this sweep's upd beats, one per word (UPD_WW each)
};

constexpr int UPD_WW = std::max(2, (UPD_BITS + 31) / 32);  // (put() reads two at least)

}  // namespace

extern "C" {

void* kv_record_new() { return new RecordHarness(); }
void kv_record_free(void* p) { delete static_cast<RecordHarness*>(p); }

// The DRAM: `words` words (all records zero), its latency, bursts in flight per direction,
// bytes a cycle (<= 0: two words a cycle, never the bound) and a planted defect (0: none).
void kv_dram(void* p, uint32_t words, uint32_t latency, uint32_t depth, double bytes_per_cycle,
             int defect) {
    auto* h = static_cast<RecordHarness*>(p);
    Dram& d = h->dram;
    d.words = words;
    d.mem.assign(size_t(words) * WW, 0);
    d.latency = latency;
    d.depth = std::max(depth, 1u);
    d.bpc = bytes_per_cycle > 0 ? bytes_per_cycle : 2 * d.word_bytes;
    d.cap = std::max(2 * d.word_bytes, d.bpc);
    d.tokens = d.cap;
    d.defect = defect;
    h->upd.assign(size_t(words) * UPD_WW, 0);
}

// Reset with the policy parameters (level inputs).
void kv_reset(void* p, uint32_t alpha, uint32_t touch, uint32_t shift) {
    auto* h = static_cast<RecordHarness*>(p);
    Timer t(h);
    auto* top = h->top;
    top->alpha = alpha;
    top->touch = touch;
    top->shift = shift;
    top->k = 0;
    top->rd_cmd___05Fready = 0;
    top->wr_cmd___05Fready = 0;
    top->rd_data___05Fvalid = 0;
    top->wr_data___05Fready = 0;
    h->reset();
}

// The decay table through table_w (256 Q0.16 values). Returns 0, or -1 on a timeout.
int kv_table(void* p, int n, const uint32_t* vals) {
    auto* h = static_cast<RecordHarness*>(p);
    Timer t(h);
    return send_table(h, h->top, n, vals, TBL_ADDR_OFF, TBL_ADDR_W, TBL_DATA_OFF, TBL_DATA_W);
}

// The host writes records into the DRAM itself (no engine cycle): `n` words at `addr`,
// each of LANES records (arrays n·LANES).
void kv_mem_write(void* p, int n, const uint32_t* addr, const uint32_t* score,
                  const uint32_t* idle, const uint8_t* pinned, const uint8_t* resident) {
    Dram& d = static_cast<RecordHarness*>(p)->dram;
    for (int i = 0; i < n; ++i) {
        uint32_t* w = d.at(addr[i]);
        for (int l = 0; l < LANES; ++l) {
            int e = i * LANES + l, base = l * REC_BITS;
            setb(w, base + REC_SCORE_OFF, REC_SCORE_W, score[e]);
            setb(w, base + REC_IDLE_OFF, REC_IDLE_W, idle[e]);
            setb(w, base + REC_PINNED_OFF, 1, pinned[e]);
            setb(w, base + REC_RESIDENT_OFF, 1, resident[e]);
        }
    }
}

// Every record the DRAM holds, by entry.
void kv_mem_read(void* p, uint32_t* score, uint32_t* idle, uint8_t* pinned, uint8_t* resident) {
    Dram& d = static_cast<RecordHarness*>(p)->dram;
    for (uint32_t a = 0; a < d.words; ++a) {
        const uint32_t* w = d.at(a);
        for (int l = 0; l < LANES; ++l) {
            size_t e = size_t(a) * LANES + l;
            int base = l * REC_BITS;
            score[e] = uint32_t(getb(w, base + REC_SCORE_OFF, REC_SCORE_W));
            idle[e] = uint32_t(getb(w, base + REC_IDLE_OFF, REC_IDLE_W));
            pinned[e] = uint8_t(getb(w, base + REC_PINNED_OFF, 1));
            resident[e] = uint8_t(getb(w, base + REC_RESIDENT_OFF, 1));
        }
    }
}

// Words moved by the DRAM so far (read, written).
void kv_dram_stats(void* p, uint64_t* out) {
    Dram& d = static_cast<RecordHarness*>(p)->dram;
    out[0] = d.reads;
    out[1] = d.writes;
}

// One sweep of every record word (a `step` beat {hold}) with this sweep's weights and read
// flags per entry (its `upd` beats), and its eviction pass of `k` victims. Victims (index,
// priority) go to vidx/vprio (at most vmax). Returns the number of victims, or -1 on a
// timeout.
int kv_sweep(void* p, int hold, int k, const uint32_t* weight, const uint8_t* read,
             int32_t* vidx, uint32_t* vprio, int vmax) {
    auto* h = static_cast<RecordHarness*>(p);
    Timer t(h);
    auto* top = h->top;
    Dram& d = h->dram;
    const uint32_t W = d.words;
    for (uint32_t a = 0; a < W; ++a) {
        uint32_t* u = &h->upd[size_t(a) * UPD_WW];
        std::memset(u, 0, UPD_WW * 4);
        for (int l = 0; l < LANES; ++l) {
            size_t e = size_t(a) * LANES + l;
            setb(u, UPD_WEIGHT_OFF[l], UPD_WEIGHT_W, weight[e]);
            setb(u, UPD_READ_OFF[l], 1, read[e]);
        }
        setb(u, UPD_HOLD_OFF, 1, uint64_t(hold));
    }
    uint32_t b[kWords];
    std::memset(b, 0, sizeof b);
    setb(b, STEP_HOLD_OFF, 1, uint64_t(hold));
    put(top->step___05Fpayload, b);
    if (top->k != k) {  // `k` enters the engine through the wrapper's register: a cycle
        top->k = k;
        h->cycle();
    }
    top->step___05Fvalid = 1;
    uint32_t uidx = 0;
    bool upd_new = true;
    int nv = 0;
    bool stepped = false, done = false;
    uint64_t waited = 0;
    const double wb = d.word_bytes;
    while (!done) {
        // The DRAM's outputs this cycle (Dram.drive).
        bool cmd_r = d.rq.size() < d.depth, cmd_w = d.wq.size() < d.depth;
        bool can_r = !d.rq.empty() && d.rq.front().start <= d.now && d.tokens >= wb;
        bool can_w = !d.wq.empty() && d.tokens >= wb;
        if (can_r && can_w && d.tokens < 2 * wb) {
            can_r = d.turn == 0;
            can_w = !can_r;
        }
        top->rd_cmd___05Fready = cmd_r;
        top->wr_cmd___05Fready = cmd_w;
        top->wr_data___05Fready = can_w;
        top->rd_data___05Fvalid = can_r;
        if (can_r) put(top->rd_data___05Fpayload, d.read_word());
        top->upd___05Fvalid = uidx < W;
        if (upd_new && uidx < W) {
            put(top->upd___05Fpayload, &h->upd[size_t(uidx) * UPD_WW]);
            upd_new = false;
        }
        h->settle();
        // What moves on this edge (Dram.sample, and the host's streams).
        if (top->step___05Fvalid && top->step___05Fready) stepped = true;
        if (top->upd___05Fvalid && top->upd___05Fready) {
            ++uidx;
            upd_new = true;
        }
        if (can_r && top->rd_data___05Fready) {
            Burst& head = d.rq.front();
            std::memcpy(d.last, d.read_word(), WW * 4);
            head.first = false;
            ++head.addr;
            if (--head.left == 0) d.rq.pop_front();
            d.tokens -= wb;
            ++d.reads;
            d.turn = 1;
        }
        if (can_w && top->wr_data___05Fvalid) {
            Burst& head = d.wq.front();
            get(top->wr_data___05Fpayload, b);
            std::memcpy(d.at(head.addr), b, WW * 4);
            ++head.addr;
            if (--head.left == 0) d.wq.pop_front();
            d.tokens -= wb;
            ++d.writes;
            d.turn = 0;
        }
        if (cmd_r && top->rd_cmd___05Fvalid) {
            get(top->rd_cmd___05Fpayload, b);
            d.rq.push_back({uint32_t(getb(b, CMD_ADDR_OFF, CMD_ADDR_W)),
                            uint32_t(getb(b, CMD_LEN_OFF, CMD_LEN_W)), d.now + 1 + d.latency, true});
        }
        if (cmd_w && top->wr_cmd___05Fvalid) {
            get(top->wr_cmd___05Fpayload, b);
            d.wq.push_back({uint32_t(getb(b, CMD_ADDR_OFF, CMD_ADDR_W)),
                            uint32_t(getb(b, CMD_LEN_OFF, CMD_LEN_W)), 0, true});
        }
        if (top->victim___05Fvalid) {
            get(top->victim___05Fpayload, b);
            if (!getb(b, VIC_EMPTY_OFF, 1) && nv < vmax) {
                vidx[nv] = int32_t(getb(b, VIC_INDEX_OFF, VIC_INDEX_W));
                vprio[nv] = uint32_t(getb(b, VIC_PRIO_OFF, VIC_PRIO_W));
                ++nv;
            }
            done = getb(b, VIC_LAST_OFF, 1) != 0;
        }
        h->edge();
        d.tokens = std::min(d.tokens + d.bpc, d.cap);
        ++d.now;
        if (stepped) top->step___05Fvalid = 0;
        if (++waited > kTimeout) return -1;
    }
    // The last victim leaves after the sweep's final beat was scored and its word written
    // back (the engine holds the beat until the memory takes it): every burst is done.
    if (!d.wq.empty() || !d.rq.empty()) return -1;
    top->upd___05Fvalid = 0;
    top->rd_data___05Fvalid = 0;
    top->rd_cmd___05Fready = 0;
    top->wr_cmd___05Fready = 0;
    top->wr_data___05Fready = 0;
    h->settle();
    return stepped ? nv : -1;
}

// Verilator's own rate on this design: `n` bare clock cycles with a `step` beat offered
// and nothing else moving (the engine idles waiting for memory). Returns the cycles run.
uint64_t kv_free_run(void* p, uint64_t n, int k) {
    auto* h = static_cast<RecordHarness*>(p);
    Timer t(h);
    h->top->k = k;
    for (uint64_t i = 0; i < n; ++i) h->cycle();
    return n;
}

}  // extern "C"
