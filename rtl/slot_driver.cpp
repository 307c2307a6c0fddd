// The host side of a Verilated slot-queue engine (CLOCK or SIEVE): drives its `cmd` stream
// and takes its `victim` stream cycle by cycle.
//
// Built into a shared library by kvcxl.rtl.verilated (which generates slot_layout.h: the
// top's class and the bit offsets of every payload field, from rtl/layouts.py) and called
// through ctypes. A beat moves on a rising edge where valid and ready are both high; every
// call clocks the model until its beats have moved, whatever the latency.

#include <chrono>
#include <cstdint>
#include <ctime>

#include "slot_layout.h"
#include "verilated.h"

namespace {

constexpr uint64_t kTimeout = 1u << 24;  // cycles a call may wait for a handshake

inline uint64_t field(uint64_t v, int off, int width) {
    return (v >> off) & ((width >= 64) ? ~0ull : ((1ull << width) - 1));
}

inline double thread_cpu() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Harness {
    VerilatedContext ctx;
    TOP_CLASS* top;
    uint64_t cycles = 0;
    double seconds = 0.0, cpu_seconds = 0.0;
    Harness() : top(new TOP_CLASS(&ctx)) {}
    ~Harness() {
        top->final();
        delete top;
    }
    void settle() { top->eval(); }
    void edge() {
        top->clk = 1;
        top->eval();
        top->clk = 0;
        ++cycles;
    }
};

struct Timer {
    Harness* h;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    double c0 = thread_cpu();
    explicit Timer(Harness* h_) : h(h_) {}
    ~Timer() {
        h->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        h->cpu_seconds += thread_cpu() - c0;
    }
};

}  // namespace

extern "C" {

void* kv_new() { return new Harness(); }
void kv_free(void* p) { delete static_cast<Harness*>(p); }
uint64_t kv_cycles(void* p) { return static_cast<Harness*>(p)->cycles; }
double kv_seconds(void* p) { return static_cast<Harness*>(p)->seconds; }
double kv_cpu_seconds(void* p) { return static_cast<Harness*>(p)->cpu_seconds; }

// Reset, then the counter's ceiling (a level input).
void kv_reset(void* p, uint32_t ref_max) {
    auto* h = static_cast<Harness*>(p);
    Timer t(h);
    auto* top = h->top;
    top->clk = 0;
    top->rst = 1;
    top->ref_max = ref_max;
    top->cmd___05Fvalid = 0;
    top->victim___05Fready = 1;
    for (int i = 0; i < 4; ++i) {
        h->settle();
        h->edge();
    }
    top->rst = 0;
    h->settle();
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
        top->cmd___05Fvalid = 1;
        for (uint64_t waited = 0;; ++waited) {
            h->settle();
            bool go = top->cmd___05Fready;
            h->edge();
            if (go) break;
            if (waited > kTimeout) return -1;
        }
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

}  // extern "C"
