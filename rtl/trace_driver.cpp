// The host side of the Verilated PolicyEngine: drives its valid/ready streams cycle by cycle.
//
// Built into a shared library by kvcxl.rtl.verilated (which generates harness_layout.h: the
// wrapper's Verilated class and the bit offsets of every payload field, from rtl/layouts.py)
// and called through ctypes. Every call runs the clock until its streams have moved their
// beats, whatever the pipeline's latency: a beat moves on a rising edge where valid and ready
// are both high. The clock, timers, handshake and payload packing are rtl/harness.h's.
// (Verilator spells the Verilog port `step__valid` as the member `step___05Fvalid`.)

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "harness_layout.h"
#include "harness.h"

extern "C" {

// Reset with the policy parameters (level inputs); every output stream is always taken
// (the wrapper ties its ready high).
void kv_reset(void* p, uint32_t alpha, uint32_t touch, uint32_t shift) {
    auto* h = static_cast<Harness*>(p);
    Timer t(h);
    auto* top = h->top;
    top->alpha = alpha;
    top->touch = touch;
    top->shift = shift;
    top->k = 0;
    h->reset();
}

// The decay table through table_w (256 Q0.16 values). Returns 0, or -1 on a timeout.
int kv_table(void* p, int n, const uint32_t* vals) {
    auto* h = static_cast<Harness*>(p);
    Timer t(h);
    return send_table(h, h->top, n, vals, TBL_ADDR_OFF, TBL_ADDR_W, TBL_DATA_OFF, TBL_DATA_W);
}

// Weight reports {index, weight} on `report`, in order. Returns 0, or -1 on a timeout.
int kv_report(void* p, int n, const uint32_t* idx, const uint32_t* w) {
    auto* h = static_cast<Harness*>(p);
    Timer t(h);
    auto* top = h->top;
    uint32_t b[kWords];
    for (int i = 0; i < n; ++i) {
        std::memset(b, 0, sizeof b);
        setb(b, REP_INDEX_OFF, REP_INDEX_W, idx[i]);
        setb(b, REP_WEIGHT_OFF, REP_WEIGHT_W, w[i]);
        put(top->report___05Fpayload, b);
        if (!send_beat(h, top->report___05Fvalid, top->report___05Fready)) return -1;
    }
    end_stream(h, top->report___05Fvalid);
    return 0;
}

// Host record writes on rec_w: `n` words at `addr`, each of LANES records (arrays n·LANES).
int kv_records(void* p, int n, const uint32_t* addr, const uint32_t* score, const uint32_t* idle,
               const uint8_t* pinned, const uint8_t* resident) {
    auto* h = static_cast<Harness*>(p);
    Timer t(h);
    auto* top = h->top;
    uint32_t b[kWords];
    for (int i = 0; i < n; ++i) {
        std::memset(b, 0, sizeof b);
        setb(b, REC_ADDR_OFF, REC_ADDR_W, addr[i]);
        for (int l = 0; l < LANES; ++l) {
            int e = i * LANES + l;
            setb(b, REC_SCORE_OFF[l], REC_SCORE_W, score[e]);
            setb(b, REC_IDLE_OFF[l], REC_IDLE_W, idle[e]);
            setb(b, REC_PINNED_OFF[l], 1, pinned[e]);
            setb(b, REC_RESIDENT_OFF[l], 1, resident[e]);
        }
        put(top->rec_w___05Fpayload, b);
        if (!send_beat(h, top->rec_w___05Fvalid, top->rec_w___05Fready)) return -1;
    }
    end_stream(h, top->rec_w___05Fvalid);
    return 0;
}

// One sweep of the weight buffer (a beat on `step` with hold/keep) and its eviction pass of
// `k` victims. Victims (index, priority) go to vidx/vprio (at most vmax); every entry's
// scored tap (score, idle, priority, eligible) to the tap arrays, indexed by entry.
// Returns the number of victims (0 for an `empty` pass), or -1 on a timeout.
int kv_sweep(void* p, int hold, int keep, int k, int32_t* vidx, uint32_t* vprio, int vmax,
             uint32_t* tap_score, uint32_t* tap_idle, uint32_t* tap_prio, uint8_t* tap_elig) {
    auto* h = static_cast<Harness*>(p);
    Timer t(h);
    auto* top = h->top;
    uint32_t b[kWords];
    std::memset(b, 0, sizeof b);
    setb(b, STEP_HOLD_OFF, 1, uint64_t(hold));
    setb(b, STEP_KEEP_OFF, 1, uint64_t(keep));
    put(top->step___05Fpayload, b);
    if (top->k != k) {  // `k` enters the engine through the wrapper's register: a cycle
        top->k = k;
        h->cycle();
    }
    top->step___05Fvalid = 1;
    int nv = 0;
    bool stepped = false, done = false;
    uint64_t waited = 0;
    while (!done) {
        h->settle();
        if (top->step___05Fvalid && top->step___05Fready) stepped = true;
        if (top->scored___05Fvalid) {
            get(top->scored___05Fpayload, b);
            uint32_t base = uint32_t(getb(b, TAP_ADDR_OFF, TAP_ADDR_W)) * LANES;
            for (int l = 0; l < LANES; ++l) {
                tap_score[base + l] = uint32_t(getb(b, TAP_SCORE_OFF[l], TAP_SCORE_W));
                tap_idle[base + l] = uint32_t(getb(b, TAP_IDLE_OFF[l], TAP_IDLE_W));
                tap_prio[base + l] = uint32_t(getb(b, TAP_PRIO_OFF[l], TAP_PRIO_W));
                tap_elig[base + l] = uint8_t(getb(b, TAP_ELIG_OFF[l], 1));
            }
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
        if (stepped) top->step___05Fvalid = 0;
        if (++waited > kTimeout) return -1;
    }
    // The last victim leaves only after the sweep's final beat was scored.
    return stepped ? nv : -1;
}

// Verilator's own rate on this design: `n` cycles of the bare clock (two evaluations each,
// no handshake, no payload read) with a `step` beat always offered and `k` victims always
// taken, so the engine sweeps and emits back to back. Leaves the engine mid-pass: reset
// it before any other use. Returns the cycles run.
uint64_t kv_free_run(void* p, uint64_t n, int k) {
    auto* h = static_cast<Harness*>(p);
    Timer t(h);
    auto* top = h->top;
    uint32_t b[kWords];
    std::memset(b, 0, sizeof b);
    setb(b, STEP_HOLD_OFF, 1, 1);  // evaluation sweeps
    put(top->step___05Fpayload, b);
    top->k = k;
    top->step___05Fvalid = 1;
    for (uint64_t i = 0; i < n; ++i) h->cycle();
    top->step___05Fvalid = 0;
    return n;
}

}  // extern "C"
