// The clock, the timers and the stream handshake every C++ driver of a Verilated engine
// shares (rtl/trace_driver.cpp, rtl/slot_driver.cpp): one copy, included once per library.
//
// The driver's generated header (from kvcxl.rtl.verilated) names the Verilated class as
// TOP_CLASS and is included before this file. That class is the harness wrapper
// kvcxl.rtl.verilated writes around the engine: reset and the level inputs (policy
// parameters, `k`) enter the engine through a register, and the ports the driver never
// moves are tied off, so the model's input-driven logic is small and one `eval()` of it
// is cheap. A cycle is two evaluations: the falling edge with this cycle's inputs
// (settle(); ready and valid are then sampled) and the rising edge (edge()).

#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

#include "verilated.h"

namespace {

constexpr uint64_t kTimeout = 1u << 24;  // cycles a call may wait for a handshake
constexpr int kResetCycles = 4;          // cycles `rst` is held high

inline double thread_cpu() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Harness {
    VerilatedContext ctx;
    TOP_CLASS* top;
    uint64_t cycles = 0;
    double seconds = 0.0;      // wall time spent clocking the model
    double cpu_seconds = 0.0;  // this thread's CPU time in it (the machine may be shared)
    Harness() : top(new TOP_CLASS(&ctx)) {}
    ~Harness() {
        top->final();
        delete top;
    }
    // Inputs are set; let the combinational outputs settle (the clock's falling edge).
    void settle() { top->eval(); }
    void edge() {
        top->clk = 1;
        top->eval();
        top->clk = 0;
        ++cycles;
    }
    void cycle() {
        settle();
        edge();
    }
    // `rst` high for kResetCycles, then one cycle more: the wrapper's reset register
    // lets the engine out of reset a cycle after `rst` falls. Level inputs are set.
    void reset() {
        top->clk = 0;
        top->rst = 1;
        for (int i = 0; i < kResetCycles; ++i) cycle();
        top->rst = 0;
        cycle();
        settle();
    }
};

// The wall and CPU time of one call, added to the harness's clocks.
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

// The handshake of an input stream, the one place it is written: its payload is set; raise
// valid and clock until a rising edge finds ready (the beat moves on that edge). Valid stays
// high for the caller's next beat; end_stream() drops it. False after kTimeout cycles.
template <typename Valid, typename Ready>
bool send_beat(Harness* h, Valid& valid, const Ready& ready) {
    valid = 1;
    for (uint64_t waited = 0;; ++waited) {
        h->settle();
        bool go = ready;
        h->edge();
        if (go) return true;
        if (waited > kTimeout) return false;
    }
}

// After the last beat: valid low, outputs settled.
template <typename Valid>
void end_stream(Harness* h, Valid& valid) {
    valid = 0;
    h->settle();
}

}  // namespace

extern "C" {

void* kv_new() { return new Harness(); }
void kv_free(void* p) { delete static_cast<Harness*>(p); }
uint64_t kv_cycles(void* p) { return static_cast<Harness*>(p)->cycles; }
double kv_seconds(void* p) { return static_cast<Harness*>(p)->seconds; }
double kv_cpu_seconds(void* p) { return static_cast<Harness*>(p)->cpu_seconds; }

}  // extern "C"
