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
// With `data_first` it takes write data before the command, as AXI allows: it buffers every
// word offered (ready whenever the engine offers one and the bandwidth allows) and takes a
// write command, looking at the one on offer, only once it holds all of that burst's words,
// which land with it; so a sweep's last write command comes after its last word, and the
// sweep runs until the engine's `busy` falls.

#include <algorithm>
#include <array>
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

// What the engine shows the memory in one cycle (tb/record_stream_model.py's `Port`).
struct Port {
    bool rd_cmd_valid = false;
    uint32_t rd_cmd_addr = 0, rd_cmd_len = 0;
    bool rd_data_ready = false, wr_cmd_valid = false;
    uint32_t wr_cmd_addr = 0, wr_cmd_len = 0;
    bool wr_data_valid = false;
    const uint32_t* wr_data = nullptr;  // WW words, read only when the word moves
};

struct Dram {
    using Word = std::array<uint32_t, WW>;
    std::vector<uint32_t> mem;  // words × WW
    uint32_t words = 0;
    uint32_t latency = 20, depth = 4;
    double word_bytes = WORD_BITS / 8.0, bpc = 0, cap = 0, tokens = 0;
    std::deque<Burst> rq, wq;
    std::deque<Word> wbuf;  // data_first: write words taken before their command
    bool data_first = false;
    uint64_t now = 0, reads = 0, writes = 0;
    int turn = 0, defect = kNone;
    // what this cycle offers (drive)
    bool rd_cmd_ready = false, wr_cmd_ready = false, rd_valid = false, wr_ready = false;
    uint32_t last[WW] = {};  // the word a read delivered last (kStaleRead)
    uint32_t* at(uint32_t a) { return &mem[size_t(a) * WW]; }
    // The word a read of the head burst offers.
    const uint32_t* read_word() {
        const Burst& b = rq.front();
        return defect == kStaleRead && b.first ? last : at(b.addr);
    }
    // This cycle's ready and valid outputs (Dram.drive). A data_first memory looks at the
    // engine's offer: its write command's valid and length, its write data's valid (all
    // from its registers, so they are known before the memory answers).
    void drive(bool wc_valid, uint32_t wc_len, bool wd_valid) {
        rd_cmd_ready = rq.size() < depth;
        bool can_r = !rq.empty() && rq.front().start <= now && tokens >= word_bytes;
        bool can_w;
        if (data_first) {
            wr_cmd_ready = wc_valid && wbuf.size() >= wc_len;
            can_w = wd_valid && tokens >= word_bytes;
        } else {
            wr_cmd_ready = wq.size() < depth;
            can_w = !wq.empty() && tokens >= word_bytes;
        }
        if (can_r && can_w && tokens < 2 * word_bytes) {
            can_r = turn == 0;
            can_w = !can_r;
        }
        rd_valid = can_r;
        wr_ready = can_w;
    }
    // The transfers of this cycle's edge, then one cycle on (Dram.sample).
    void sample(const Port& p) {
        if (rd_valid && p.rd_data_ready) {
            Burst& head = rq.front();
            const uint32_t* w = read_word();
            if (w != last) std::memcpy(last, w, WW * 4);
            head.first = false;
            ++head.addr;
            if (--head.left == 0) rq.pop_front();
            tokens -= word_bytes;
            ++reads;
            turn = 1;
        }
        if (wr_ready && p.wr_data_valid) {
            if (data_first) {
                Word w;
                std::memcpy(w.data(), p.wr_data, WW * 4);
                wbuf.push_back(w);
            } else {
                Burst& head = wq.front();
                std::memcpy(at(head.addr), p.wr_data, WW * 4);
                ++head.addr;
                if (--head.left == 0) wq.pop_front();
            }
            tokens -= word_bytes;
            ++writes;
            turn = 0;
        }
        if (rd_cmd_ready && p.rd_cmd_valid)
            rq.push_back({p.rd_cmd_addr, p.rd_cmd_len, now + 1 + latency, true});
        if (wr_cmd_ready && p.wr_cmd_valid) {
            if (data_first) {  // the burst's words, taken in order, land with its command
                for (uint32_t a = p.wr_cmd_addr; a < p.wr_cmd_addr + p.wr_cmd_len; ++a) {
                    std::memcpy(at(a), wbuf.front().data(), WW * 4);
                    wbuf.pop_front();
                }
            } else {
                wq.push_back({p.wr_cmd_addr, p.wr_cmd_len, 0, true});
            }
        }
        tokens = std::min(tokens + bpc, cap);
        ++now;
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
// bytes a cycle (<= 0: two words a cycle, never the bound), a planted defect (0: none) and
// whether it takes write data before the command (data_first).
void kv_dram(void* p, uint32_t words, uint32_t latency, uint32_t depth, double bytes_per_cycle,
             int defect, int data_first) {
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
    d.data_first = data_first != 0;
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

// Words moved by the DRAM so far (read, written), and the write words it holds without
// their command (data_first).
void kv_dram_stats(void* p, uint64_t* out) {
    Dram& d = static_cast<RecordHarness*>(p)->dram;
    out[0] = d.reads;
    out[1] = d.writes;
    out[2] = d.wbuf.size();
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
    uint32_t b[kWords], wd[kWords];
    std::memset(b, 0, sizeof b);
    std::memset(wd, 0, sizeof wd);
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
    bool stepped = false, done = false, busy = true;
    uint64_t waited = 0;
    // Until the last victim and `busy` low: a memory that takes the data first takes the
    // sweep's last write command (and lands its words) after the last word, maybe after the
    // last victim. A memory that takes commands first has them all by then.
    while (!done || busy) {
        // The DRAM's outputs this cycle (Dram.drive), from the engine's registered offer.
        uint32_t wc_len = 0;
        if (d.data_first && top->wr_cmd___05Fvalid) {
            get(top->wr_cmd___05Fpayload, b);
            wc_len = uint32_t(getb(b, CMD_LEN_OFF, CMD_LEN_W));
        }
        d.drive(top->wr_cmd___05Fvalid, wc_len, top->wr_data___05Fvalid);
        top->rd_cmd___05Fready = d.rd_cmd_ready;
        top->wr_cmd___05Fready = d.wr_cmd_ready;
        top->wr_data___05Fready = d.wr_ready;
        top->rd_data___05Fvalid = d.rd_valid;
        if (d.rd_valid) put(top->rd_data___05Fpayload, d.read_word());
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
        Port port;
        port.rd_cmd_valid = top->rd_cmd___05Fvalid;
        if (port.rd_cmd_valid) {
            get(top->rd_cmd___05Fpayload, b);
            port.rd_cmd_addr = uint32_t(getb(b, CMD_ADDR_OFF, CMD_ADDR_W));
            port.rd_cmd_len = uint32_t(getb(b, CMD_LEN_OFF, CMD_LEN_W));
        }
        port.rd_data_ready = top->rd_data___05Fready;
        port.wr_cmd_valid = top->wr_cmd___05Fvalid;
        if (port.wr_cmd_valid) {
            get(top->wr_cmd___05Fpayload, b);
            port.wr_cmd_addr = uint32_t(getb(b, CMD_ADDR_OFF, CMD_ADDR_W));
            port.wr_cmd_len = uint32_t(getb(b, CMD_LEN_OFF, CMD_LEN_W));
        }
        port.wr_data_valid = top->wr_data___05Fvalid;
        if (port.wr_data_valid && d.wr_ready) get(top->wr_data___05Fpayload, wd);
        port.wr_data = wd;
        d.sample(port);
        if (top->victim___05Fvalid) {
            get(top->victim___05Fpayload, b);
            if (!getb(b, VIC_EMPTY_OFF, 1) && nv < vmax) {
                vidx[nv] = int32_t(getb(b, VIC_INDEX_OFF, VIC_INDEX_W));
                vprio[nv] = uint32_t(getb(b, VIC_PRIO_OFF, VIC_PRIO_W));
                ++nv;
            }
            done = done || getb(b, VIC_LAST_OFF, 1) != 0;
        }
        h->edge();
        busy = top->busy;
        if (stepped) top->step___05Fvalid = 0;
        if (++waited > kTimeout) return -1;
    }
    // The sweep is over (its last victim out, busy low): every burst must be done and, with
    // data_first, every word taken have landed with its command. A write command the
    // engine never sent leaves its words here (the planted early_done).
    if (!d.wq.empty() || !d.rq.empty() || !d.wbuf.empty()) return -2;
    top->upd___05Fvalid = 0;
    top->rd_data___05Fvalid = 0;
    top->rd_cmd___05Fready = 0;
    top->wr_cmd___05Fready = 0;
    top->wr_data___05Fready = 0;
    h->settle();
    return stepped ? nv : -1;
}

// The DRAM model alone, one cycle in two calls (no engine clocked), so a test can hold it
// to tb/record_stream_model.py's Dram cycle for cycle. kv_dram_drive: the engine's offer
// (write command valid and length, write data valid) in; rd_cmd_ready, wr_cmd_ready,
// rd_valid, wr_ready and the read word (WW words, zero unless rd_valid) out.
void kv_dram_drive(void* p, int wc_valid, uint32_t wc_len, int wd_valid, uint32_t* out) {
    Dram& d = static_cast<RecordHarness*>(p)->dram;
    d.drive(wc_valid != 0, wc_len, wd_valid != 0);
    out[0] = d.rd_cmd_ready;
    out[1] = d.wr_cmd_ready;
    out[2] = d.rd_valid;
    out[3] = d.wr_ready;
    if (d.rd_valid)
        std::memcpy(out + 4, d.read_word(), WW * 4);
    else
        std::memset(out + 4, 0, WW * 4);
}

// kv_dram_sample: the port (rd_cmd valid, addr, len; rd_data ready; wr_cmd valid, addr,
// len; wr_data valid) and the write word (WW words); the edge's transfers, a cycle on.
// Returns 0, or -1 for a command past the memory's end.
int kv_dram_sample(void* p, const uint32_t* port, const uint32_t* wdata) {
    Dram& d = static_cast<RecordHarness*>(p)->dram;
    Port q;
    q.rd_cmd_valid = port[0] != 0;
    q.rd_cmd_addr = port[1];
    q.rd_cmd_len = port[2];
    q.rd_data_ready = port[3] != 0;
    q.wr_cmd_valid = port[4] != 0;
    q.wr_cmd_addr = port[5];
    q.wr_cmd_len = port[6];
    q.wr_data_valid = port[7] != 0;
    q.wr_data = wdata;
    if ((q.rd_cmd_valid && uint64_t(q.rd_cmd_addr) + q.rd_cmd_len > d.words) ||
        (q.wr_cmd_valid && uint64_t(q.wr_cmd_addr) + q.wr_cmd_len > d.words))
        return -1;
    d.sample(q);
    return 0;
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
