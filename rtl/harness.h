// The clock, the timers, the stream handshake and the payload packing every C++ driver of a
// Verilated engine shares (rtl/trace_driver.cpp, rtl/slot_driver.cpp, rtl/record_driver.cpp):
// one copy, included once per library.
//
// The driver's generated header (from kvcxl.rtl.verilated) names the Verilated class as
// TOP_CLASS and is included before this file. That class is the harness wrapper
// kvcxl.rtl.verilated writes around the engine: reset and the level inputs (policy
// parameters, `k`) enter the engine through a register, and the ports the driver never
// moves are tied off, so the model's input-driven logic is small and one `eval()` of it
// is cheap. A cycle is two evaluations: the falling edge with this cycle's inputs
// (settle(); ready and valid are then sampled) and the rising edge (edge()).

#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "verilated.h"

namespace {

constexpr uint64_t kTimeout = 1u << 24;  // cycles a call may wait for a handshake
constexpr int kResetCycles = 4;          // cycles `rst` is held high
constexpr int kWords = 32;               // payload buffer (the widest port here is < 1024 bits)

// A payload as 32-bit words: setb/getb write and read the `width`-bit field at bit `off`;
// put/get copy a buffer to and from a Verilated port (a scalar of up to 64 bits or a VlWide).
inline void setb(uint32_t* w, int off, int width, uint64_t v) {
    for (int done = 0; done < width;) {
        int i = off + done, sh = i & 31, take = std::min(32 - sh, width - done);
        uint32_t mask = (take == 32 ? 0xffffffffu : ((1u << take) - 1)) << sh;
        w[i >> 5] = (w[i >> 5] & ~mask) | ((uint32_t(v >> done) << sh) & mask);
        done += take;
    }
}

inline uint64_t getb(const uint32_t* w, int off, int width) {
    uint64_t v = 0;
    for (int done = 0; done < width;) {
        int i = off + done, sh = i & 31, take = std::min(32 - sh, width - done);
        uint64_t part = (w[i >> 5] >> sh) & (take == 32 ? 0xffffffffull : ((1ull << take) - 1));
        v |= part << done;
        done += take;
    }
    return v;
}

template <typename T>
inline void put(T& port, const uint32_t* b) {
    port = static_cast<T>(uint64_t(b[0]) | (uint64_t(b[1]) << 32));
}
template <std::size_t N>
inline void put(VlWide<N>& port, const uint32_t* b) {
    for (std::size_t i = 0; i < N; ++i) port[i] = b[i];
}
template <typename T>
inline void get(const T& port, uint32_t* b) {
    uint64_t v = port;
    b[0] = uint32_t(v);
    b[1] = uint32_t(v >> 32);
}
template <std::size_t N>
inline void get(const VlWide<N>& port, uint32_t* b) {
    for (std::size_t i = 0; i < N; ++i) b[i] = port[i];
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

// The decay table through table_w: beat i carries {i, vals[i]} at the field offsets of the
// driver's generated layout (a template, so a design without table_w never instantiates
// it). Returns 0, or -1 on a timeout.
template <typename Top>
int send_table(Harness* h, Top* top, int n, const uint32_t* vals, int addr_off, int addr_w,
               int data_off, int data_w) {
    uint32_t b[kWords];
    for (int i = 0; i < n; ++i) {
        std::memset(b, 0, sizeof b);
        setb(b, addr_off, addr_w, uint64_t(i));
        setb(b, data_off, data_w, vals[i]);
        put(top->table_w___05Fpayload, b);
        if (!send_beat(h, top->table_w___05Fvalid, top->table_w___05Fready)) return -1;
    }
    end_stream(h, top->table_w___05Fvalid);
    return 0;
}

}  // namespace

extern "C" {

void* kv_new() { return new Harness(); }
void kv_free(void* p) { delete static_cast<Harness*>(p); }
uint64_t kv_cycles(void* p) { return static_cast<Harness*>(p)->cycles; }
double kv_seconds(void* p) { return static_cast<Harness*>(p)->seconds; }
double kv_cpu_seconds(void* p) { return static_cast<Harness*>(p)->cpu_seconds; }

}  // extern "C"
