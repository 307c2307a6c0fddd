/* kvcxl TCG plugin: streams the guest's accesses to the CXL fixed memory window into a
 * shared-memory ring (struct kvcxl_acc_hdr + records, kvcxl_ring.h) that the firmware
 * service drains, so the firmware sees the CXL.mem traffic the guest really makes.
 *
 *   -plugin libkvcxl-plugin.so,ring=/dev/shm/FILE,lo=0xGPA,hi=0xGPA[,records=2^n][,arm=ring]
 *
 * The memory callback runs after each memory access of every instruction; it filters
 * on the guest-physical address, so the cost outside the window is one range check
 * (but a callback on every access makes the guest 3-4x slower).  With arm=ring (the
 * default) the guest boots uninstrumented: a watcher thread waits for the service to
 * set `armed` in the ring header (it does on the first ring command), then the
 * plugin resets itself and instruments every translation from then on.  arm=always
 * instruments from the first instruction. */
#include <fcntl.h>
#include <glib.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <qemu/qemu-plugin.h>

#include "kvcxl_ring.h"

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

static struct kvcxl_acc_hdr *hdr;
static struct kvcxl_acc_rec *recs;
static uint64_t lo, hi;
static GMutex lock;
static qemu_plugin_id_t self;
static struct qemu_plugin_scoreboard *arm_board; /* per vCPU: 1 once armed */
static qemu_plugin_u64 arm_flag;
static int resetting;
static volatile int watcher_stop;
static GThread *watcher;

static void on_mem(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr, void *udata)
{
    struct qemu_plugin_hwaddr *hw = qemu_plugin_get_hwaddr(info, vaddr);
    if (!hw)
        return;
    uint64_t pa = qemu_plugin_hwaddr_phys_addr(hw);
    if (pa < lo || pa >= hi)
        return;
    uint32_t size = 1u << qemu_plugin_mem_size_shift(info);
    uint32_t flags = size | (qemu_plugin_mem_is_store(info) ? 1u << 16 : 0);
    g_mutex_lock(&lock);
    hdr->seen++;
    uint64_t head = hdr->head, tail = __atomic_load_n(&hdr->tail, __ATOMIC_ACQUIRE);
    if (head - tail >= hdr->capacity) {
        hdr->dropped++;
    } else {
        struct kvcxl_acc_rec *r = &recs[head & (hdr->capacity - 1)];
        r->gpa = pa;
        r->size_flags = flags;
        r->vcpu = vcpu;
        __atomic_store_n(&hdr->head, head + 1, __ATOMIC_RELEASE);
    }
    g_mutex_unlock(&lock);
}

static void plugin_exit(qemu_plugin_id_t id, void *p);

static void on_tb(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    size_t n = qemu_plugin_tb_n_insns(tb);
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        qemu_plugin_register_vcpu_mem_cb(insn, on_mem, QEMU_PLUGIN_CB_NO_REGS,
                                         QEMU_PLUGIN_MEM_RW, NULL);
    }
}

/* Unarmed phase: each translation block only checks the per-vCPU arm flag inline. */
static void on_reset(qemu_plugin_id_t id)
{
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb);
    qemu_plugin_register_atexit_cb(id, plugin_exit, NULL);
    __atomic_store_n(&hdr->armed, 2, __ATOMIC_RELEASE); /* instrumenting from now on */
}

static void on_armed_tb(unsigned int vcpu, void *udata)
{
    if (!__atomic_exchange_n(&resetting, 1, __ATOMIC_ACQ_REL))
        qemu_plugin_reset(self, on_reset); /* flushes translations; on_reset re-registers */
}

static void on_tb_unarmed(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    qemu_plugin_register_vcpu_tb_exec_cond_cb(tb, on_armed_tb, QEMU_PLUGIN_CB_NO_REGS,
                                              QEMU_PLUGIN_COND_NE, arm_flag, 0, NULL);
}

static gpointer watch(gpointer data)
{
    while (!watcher_stop && !__atomic_load_n(&hdr->armed, __ATOMIC_ACQUIRE))
        g_usleep(5000);
    if (!watcher_stop)
        for (int i = 0; i < qemu_plugin_num_vcpus(); i++)
            qemu_plugin_u64_set(arm_flag, i, 1);
    return NULL;
}

static void plugin_exit(qemu_plugin_id_t id, void *p)
{
    watcher_stop = 1;
    if (hdr)
        fprintf(stderr, "kvcxl-plugin: %" PRIu64 " CXL-window accesses, %" PRIu64 " dropped\n",
                hdr->seen, hdr->dropped);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv)
{
    const char *path = NULL;
    uint64_t n = 1u << 20;
    int always = 0;
    for (int i = 0; i < argc; i++) {
        if (!strncmp(argv[i], "ring=", 5))
            path = argv[i] + 5;
        else if (!strncmp(argv[i], "lo=", 3))
            lo = strtoull(argv[i] + 3, NULL, 0);
        else if (!strncmp(argv[i], "hi=", 3))
            hi = strtoull(argv[i] + 3, NULL, 0);
        else if (!strncmp(argv[i], "records=", 8))
            n = strtoull(argv[i] + 8, NULL, 0);
        else if (!strcmp(argv[i], "arm=always"))
            always = 1;
        else if (!strcmp(argv[i], "arm=ring"))
            always = 0;
        else {
            fprintf(stderr, "kvcxl-plugin: unknown argument %s\n", argv[i]);
            return -1;
        }
    }
    if (!path || hi <= lo || n == 0 || (n & (n - 1))) {
        fprintf(stderr, "kvcxl-plugin: need ring=PATH, lo < hi, records a power of two\n");
        return -1;
    }
    size_t bytes = sizeof *hdr + n * sizeof *recs;
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, bytes) != 0) {
        perror("kvcxl-plugin: ring file");
        return -1;
    }
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        perror("kvcxl-plugin: mmap");
        return -1;
    }
    hdr = m;
    recs = (struct kvcxl_acc_rec *)(hdr + 1);
    memset(hdr, 0, sizeof *hdr);
    hdr->capacity = (uint32_t)n;
    __atomic_store_n(&hdr->magic, KVCXL_ACC_MAGIC, __ATOMIC_RELEASE);
    g_mutex_init(&lock);
    self = id;
    hdr->armed = always ? 2 : 0;
    if (always) {
        qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb);
    } else {
        arm_board = qemu_plugin_scoreboard_new(sizeof(uint64_t));
        arm_flag = qemu_plugin_scoreboard_u64(arm_board);
        qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_unarmed);
        watcher = g_thread_new("kvcxl-arm", watch, NULL);
    }
    qemu_plugin_register_atexit_cb(id, plugin_exit, NULL);
    return 0;
}
