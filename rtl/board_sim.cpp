// The Verilated board top behind a pseudo-terminal: a UART model turns the bytes a host
// writes to the pty into frames on `rx` and the frames on `tx` back into bytes.
// Usage: board_sim DIVISOR   (prints the pty's path on stdout, then runs until killed)
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <termios.h>
#include <unistd.h>

#include <deque>
#include <vector>

#include "Vboard.h"
#include "verilated.h"

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: board_sim DIVISOR\n");
        return 2;
    }
    const int divisor = atoi(argv[1]);
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master)) {
        perror("pty");
        return 1;
    }
    // Hold the slave open: the master then never reads EOF between host sessions.
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    struct termios t;
    tcgetattr(slave, &t);
    cfmakeraw(&t);
    tcsetattr(slave, TCSANOW, &t);
    fcntl(master, F_SETFL, O_NONBLOCK);
    printf("%s\n", ptsname(master));
    fflush(stdout);

    Verilated::commandArgs(argc, argv);
    Vboard* top = new Vboard;
    top->rx = 1;
    top->rst = 1;
    for (int i = 0; i < 4; i++) {
        top->clk = 0; top->eval(); top->clk = 1; top->eval();
    }
    top->rst = 0;

    std::deque<unsigned char> in;
    std::vector<unsigned char> out;
    int rx_bit = -1, rx_timer = 0;  // driver: bit being sent (-1 idle), cycles left in it
    unsigned rx_frame = 0;
    int tx_bit = -1, tx_timer = 0;  // monitor: bit being sampled (-1 idle)
    unsigned tx_byte = 0;
    long quiet = 0;  // cycles with no line activity
    unsigned char chunk[4096];
    for (unsigned long cycle = 0;; cycle++) {
        if ((cycle & 63) == 0) {
            if (!out.empty()) {
                ssize_t n = write(master, out.data(), out.size());
                if (n > 0) out.erase(out.begin(), out.begin() + n);
            }
            if (in.empty() && rx_bit < 0 && tx_bit < 0 && quiet > 200000) {
                struct pollfd p = {master, POLLIN, 0};
                poll(&p, 1, 1);  // idle: sleep until the host writes
            }
            ssize_t n = read(master, chunk, sizeof chunk);
            if (n > 0) in.insert(in.end(), chunk, chunk + n);
        }
        // Line driver: start bit, 8 data bits LSB first, stop bit.
        if (rx_bit < 0 && !in.empty()) {
            rx_frame = (1u << 9) | ((unsigned)in.front() << 1);
            in.pop_front();
            rx_bit = 0;
            rx_timer = divisor;
        }
        if (rx_bit >= 0) {
            top->rx = (rx_frame >> rx_bit) & 1;
            if (--rx_timer == 0) {
                rx_timer = divisor;
                if (++rx_bit == 10) rx_bit = -1;
            }
        } else {
            top->rx = 1;
        }
        top->clk = 0; top->eval(); top->clk = 1; top->eval();
        // Line monitor: find the start bit's edge, sample each bit in its middle.
        int line = top->tx;
        if (tx_bit < 0) {
            if (!line) { tx_bit = 0; tx_timer = divisor / 2; tx_byte = 0; }
        } else if (--tx_timer == 0) {
            tx_timer = divisor;
            if (tx_bit >= 1 && tx_bit <= 8) tx_byte |= (unsigned)line << (tx_bit - 1);
            if (tx_bit == 0 && line) tx_bit = -1;          // a glitch, not a start bit
            else if (tx_bit == 9) { if (line) out.push_back(tx_byte); tx_bit = -1; }
            else tx_bit++;
        }
        quiet = (rx_bit >= 0 || tx_bit >= 0 || !in.empty() || !out.empty()) ? 0 : quiet + 1;
    }
}
