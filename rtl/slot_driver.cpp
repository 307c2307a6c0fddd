// The host side of a Verilated slot-queue engine (CLOCK or SIEVE): drives its `cmd` stream
// and takes its `victim` stream cycle by cycle.
//
// Built into a shared library by kvcxl.rtl.verilated (which generates slot_layout.h: the
// wrapper's Verilated class and the bit offsets of every payload field, from rtl/layouts.py)
// and called through ctypes. A beat moves on a rising edge where valid and ready are both
// high; every call clocks the model until its beats have moved, whatever the latency. The
// clock, timers and handshake are rtl/harness.h's.

#include <cstdint>

#include "slot_layout.h"
#include "harness.h"

namespace {

inline uint64_t field(uint64_t v, int off, int width) {
    return (v >> off) & ((width >= 64) ? ~0ull : ((1ull << width) - 1));
}

}  // namespace

extern "C" {

// Reset with the counter's ceiling (a level input); victims are always taken (the wrapper
// ties their ready high).
void kv_reset(void* p, uint32_t ref_max) {
    auto* h = static_cast<Harness*>(p);
    Timer t(h);
    auto* top = h->top;
    top->ref_max = ref_max;
    top->cmd___05Fvalid = 0;
    h->reset();
}

// `n` commands in order; the victims of their walks to `vout` (at most `vmax`).
// Returns the number of victims, or -1 on a timeout (a hang).
int kv_run(void* p, int n, const uint32_t* op, const uint32_t* slot, const uint32_t* arg,
           const uint32_t* keep, int32_t* vout, int vmax) {
    auto* h = static_cast<Harness*>(p);
    Timer t(h);
    auto* top = h->top;
    int nv = 0;
    for (int i = 0; i < n; ++i) {
        uint64_t b = (uint64_t(op[i]) << CMD_OP_OFF) | (uint64_t(slot[i]) << CMD_SLOT_OFF) |
                     (uint64_t(arg[i]) << CMD_ARG_OFF) | (uint64_t(keep[i]) << CMD_KEEP_OFF);
        top->cmd___05Fpayload = b;
        if (!send_beat(h, top->cmd___05Fvalid, top->cmd___05Fready)) return -1;
        top->cmd___05Fvalid = 0;
        if (op[i] != OP_WALK) continue;
        for (uint64_t waited = 0;; ++waited) {
            h->settle();
            bool done = false;
            if (top->victim___05Fvalid) {
                uint64_t v = top->victim___05Fpayload;
                if (!field(v, VIC_EMPTY_OFF, 1) && nv < vmax)
                    vout[nv++] = int32_t(field(v, VIC_INDEX_OFF, VIC_INDEX_W));
                done = field(v, VIC_LAST_OFF, 1) != 0;
            }
            h->edge();
            if (done) break;
            if (waited > kTimeout) return -1;
        }
    }
    h->settle();
    return nv;
}

// Verilator's own rate on this design: `n` cycles of the bare clock (two evaluations each)
// with no command offered. Returns the cycles run.
uint64_t kv_free_run(void* p, uint64_t n, int) {
    auto* h = static_cast<Harness*>(p);
    Timer t(h);
    h->top->cmd___05Fvalid = 0;
    for (uint64_t i = 0; i < n; ++i) h->cycle();
    return n;
}

}  // extern "C"
