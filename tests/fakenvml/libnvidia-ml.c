/*
 * A stand-in libnvidia-ml.so.1 for tests on machines without an NVIDIA GPU.
 *
 * Loaded by the real nvidia-ml-py bindings (pynvml) through LD_LIBRARY_PATH. Exports only the
 * symbols otel_stages uses; pynvml looks functions up by name, so a missing one raises
 * NVMLError_FunctionNotFound exactly as with an old driver. Structure layouts mirror pynvml's
 * ctypes definitions (c_nvmlMemory_t, c_nvmlMemory_v2_t, c_nvmlSample_t, c_nvmlUtilization_t).
 *
 * Scripted by environment variables, read at nvmlInit:
 *   FAKE_NVML_SCENARIO     comma-separated flags:
 *                          init_error        nvmlInit -> NVML_ERROR_DRIVER_NOT_LOADED
 *                          version_mismatch  nvmlInit -> NVML_ERROR_LIB_RM_VERSION_MISMATCH
 *                          mig               GPU 0 in MIG mode with one MIG instance; utilization
 *                                            NOT_SUPPORTED on both, power NOT_SUPPORTED on the MIG
 *                          empty_ring        nvmlDeviceGetSamples -> NOT_FOUND (idle GPU), rates 0 %
 *                          boot_clock        sample timestamps in CLOCK_BOOTTIME us, not Unix us
 *                          bad_name          device name holds bytes that are not UTF-8
 *                          memv2_mismatch    nvmlDeviceGetMemoryInfo_v2 -> ARGUMENT_VERSION_MISMATCH
 *                          memory_pressure   GPU memory in phases of FAKE_NVML_MEMORY_PERIOD_MS
 *                                            (default 300) on the sample clock: a pressure phase
 *                                            (the first of each pair) with memory used at 93 % /
 *                                            99 % of total, switching every 40 ms (allocation and
 *                                            release near the limit), then a calm phase flat at
 *                                            60 %. A workload that reads the same clock can make
 *                                            its forwards slow in the pressure phases.
 *   FAKE_NVML_GPUS         number of GPUs (default 1, at most 4)
 *   FAKE_NVML_INIT_DELAY_MS  nvmlInit sleeps this long first (slow init)
 *   FAKE_NVML_SAMPLE_US    ring sample period in microseconds (default 166667, as on recent GPUs)
 *   FAKE_NVML_PERIOD_MS    utilization is a square wave: busy this long, idle this long, ...
 *                          (computed from the sample timestamps, so exact for every sample);
 *                          0 (default) = constant FAKE_NVML_UTIL percent (default 40)
 *   FAKE_NVML_CALL_LOG     append "<call> <thread id>" lines for init/samples/shutdown to this file
 *   FAKE_NVML_POWER_HANG_GPU  index of a GPU whose nvmlDeviceGetPowerUsage blocks for
 *                          FAKE_NVML_HANG_MS (default 30000) ms, as a wedged driver call does
 *   FAKE_NVML_POWER_FAIL_GPU  index of a GPU whose nvmlDeviceGetPowerUsage returns NVML_ERROR_UNKNOWN
 * Compile with -DFAKE_NO_MEMORY_V2 for a library without nvmlDeviceGetMemoryInfo_v2 (old driver).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18, NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; long long sll; int si; unsigned short us; } nvmlValue_t;
typedef struct { unsigned long long timeStamp; nvmlValue_t sampleValue; } nvmlSample_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

typedef struct fake_device {
    int index, is_mig;
    struct fake_device *parent;
    char uuid[96], name[96];
} fake_device_t;
typedef fake_device_t *nvmlDevice_t;

#define MAX_GPUS 4
#define RING_SIZE 120
#define GIB (1024ULL * 1024 * 1024)
static fake_device_t gpus[MAX_GPUS], migs[MAX_GPUS];
static int initialized, n_gpus = 1;
static unsigned long long sample_us = 166667, period_us;
static long long init_delay_ms;
static unsigned int constant_util = 40;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
enum { NVML_ERROR_UNKNOWN = 999 };

/* A process forked while another thread held log_lock must not inherit it locked. */
static void reset_log_lock(void) { pthread_mutex_init(&log_lock, NULL); }
__attribute__((constructor)) static void register_fork_handler(void) {
    pthread_atfork(NULL, NULL, reset_log_lock);
}

static int has(const char *flag) {
    const char *s = getenv("FAKE_NVML_SCENARIO");
    size_t n = strlen(flag);
    while (s && *s) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        if (len == n && strncmp(s, flag, n) == 0) return 1;
        s = end ? end + 1 : NULL;
    }
    return 0;
}

static long long env_ll(const char *name, long long fallback) {
    const char *v = getenv(name);
    return v && *v ? atoll(v) : fallback;
}

static void log_call(const char *name) {
    const char *path = getenv("FAKE_NVML_CALL_LOG");
    if (!path) return;
    pthread_mutex_lock(&log_lock);
    FILE *f = fopen(path, "a");
    if (f) { fprintf(f, "%s %ld\n", name, (long)syscall(SYS_gettid)); fclose(f); }
    pthread_mutex_unlock(&log_lock);
}

static unsigned long long now_us(void) {
    struct timespec ts;
    clock_gettime(has("boot_clock") ? CLOCK_BOOTTIME : CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

/* Percent of [end - sample_us, end] inside a busy half of the square wave (exact integral). */
static unsigned int utilization_over(unsigned long long end) {
    if (period_us == 0) return constant_util;
    unsigned long long busy = 0, t = end - sample_us;
    while (t < end) {
        unsigned long long phase = t % (2 * period_us);
        unsigned long long edge = t - phase + (phase < period_us ? period_us : 2 * period_us);
        unsigned long long stop = edge < end ? edge : end;
        if (phase < period_us) busy += stop - t;
        t = stop;
    }
    return (unsigned int)(100 * busy / sample_us);
}

static int valid(nvmlDevice_t d) {
    for (int i = 0; i < MAX_GPUS; i++) if (d == &gpus[i] || d == &migs[i]) return initialized > 0;
    return 0;
}

static nvmlReturn_t copy_text(const char *text, char *buf, unsigned int len) {
    if (strlen(text) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    log_call("nvmlInit");
    init_delay_ms = env_ll("FAKE_NVML_INIT_DELAY_MS", 0);
    if (init_delay_ms > 0) usleep((useconds_t)(init_delay_ms * 1000));
    if (has("init_error")) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (has("version_mismatch")) return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    n_gpus = (int)env_ll("FAKE_NVML_GPUS", 1);
    if (n_gpus < 0) n_gpus = 0;
    if (n_gpus > MAX_GPUS) n_gpus = MAX_GPUS;
    sample_us = (unsigned long long)env_ll("FAKE_NVML_SAMPLE_US", 166667);
    if (sample_us == 0) sample_us = 166667;
    period_us = (unsigned long long)env_ll("FAKE_NVML_PERIOD_MS", 0) * 1000;
    constant_util = (unsigned int)env_ll("FAKE_NVML_UTIL", 40);
    for (int i = 0; i < n_gpus; i++) {
        gpus[i].index = i;
        snprintf(gpus[i].uuid, sizeof gpus[i].uuid, "GPU-fa4e0000-0000-0000-0000-00000000000%d", i);
        if (has("bad_name")) snprintf(gpus[i].name, sizeof gpus[i].name, "NVIDIA Fake \xff\xfe GPU");
        else snprintf(gpus[i].name, sizeof gpus[i].name, "NVIDIA Fake H100");
        migs[i].index = i;
        migs[i].is_mig = 1;
        migs[i].parent = &gpus[i];
        snprintf(migs[i].uuid, sizeof migs[i].uuid, "MIG-fa4e0000-0000-0000-0000-00000000100%d", i);
        snprintf(migs[i].name, sizeof migs[i].name, "NVIDIA Fake H100 MIG 1g.10gb");
    }
    initialized++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    log_call("nvmlShutdown");
    if (initialized <= 0) return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned int len) { return copy_text("999.99-fake", buf, len); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *buf, unsigned int len) { return copy_text("99.999.99-fake", buf, len); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *count = (unsigned int)n_gpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (index >= (unsigned int)n_gpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned int len) {
    return valid(d) ? copy_text(d->uuid, buf, len) : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned int len) {
    return valid(d) ? copy_text(d->name, buf, len) : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    if (!valid(d) || d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (!has("mig")) return NVML_ERROR_NOT_SUPPORTED;  /* like a GPU without MIG support */
    *current = *pending = d->index == 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    if (!valid(d) || !has("mig")) return NVML_ERROR_NOT_SUPPORTED;
    *count = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    if (!valid(d) || !has("mig") || d->is_mig || d->index != 0) return NVML_ERROR_NOT_SUPPORTED;
    if (index != 0) return NVML_ERROR_NOT_FOUND;
    *mig = &migs[d->index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t d, int type, unsigned long long last_seen,
                                  int *value_type, unsigned int *count, nvmlSample_t *samples) {
    log_call("nvmlDeviceGetSamples");
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (type != 1 || (has("mig") && (d->is_mig || d->index == 0))) return NVML_ERROR_NOT_SUPPORTED;
    if (has("empty_ring")) return NVML_ERROR_NOT_FOUND;
    unsigned long long newest = now_us() / sample_us;
    unsigned long long first = newest >= RING_SIZE ? newest - RING_SIZE + 1 : 0;
    if (last_seen / sample_us + 1 > first) first = last_seen / sample_us + 1;
    if (first > newest) return NVML_ERROR_NOT_FOUND;
    unsigned int n = (unsigned int)(newest - first + 1);
    *value_type = 1;  /* NVML_VALUE_TYPE_UNSIGNED_INT */
    if (samples == NULL) { *count = n; return NVML_SUCCESS; }
    if (n > *count) n = *count;  /* time moved on between the size call and this one */
    for (unsigned int i = 0; i < n; i++) {
        unsigned long long ts = (first + i) * sample_us;
        samples[i].timeStamp = ts;
        samples[i].sampleValue.ull = 0;
        samples[i].sampleValue.ui = utilization_over(ts);
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (has("mig") && (d->is_mig || d->index == 0)) return NVML_ERROR_NOT_SUPPORTED;
    u->gpu = has("empty_ring") ? 0 : utilization_over(now_us());
    u->memory = u->gpu / 2;
    return NVML_SUCCESS;
}

static unsigned long long total_bytes(nvmlDevice_t d) { return d->is_mig ? 10 * GIB : 80 * GIB; }
static unsigned long long used_bytes(nvmlDevice_t d) {
    if (has("memory_pressure") && !d->is_mig) {
        unsigned long long period = (unsigned long long)env_ll("FAKE_NVML_MEMORY_PERIOD_MS", 300) * 1000;
        unsigned long long now = now_us();
        if (period == 0 || now % (2 * period) >= period) return total_bytes(d) / 100 * 60;
        return total_bytes(d) / 100 * ((now / 40000) % 2 ? 99 : 93);
    }
    return d->is_mig ? 2 * GIB : 30 * GIB;
}
#define RESERVED_BYTES (512ULL * 1024 * 1024)

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = total_bytes(d);
    m->used = used_bytes(d) + RESERVED_BYTES;  /* v1 counts driver-reserved memory as used */
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

#ifndef FAKE_NO_MEMORY_V2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (has("memv2_mismatch") || m->version != 0x02000028) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    m->total = total_bytes(d);
    m->reserved = RESERVED_BYTES;
    m->used = used_bytes(d);
    m->free = m->total - m->used - m->reserved;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *milliwatts) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    if (env_ll("FAKE_NVML_POWER_FAIL_GPU", -1) == d->index) return NVML_ERROR_UNKNOWN;
    if (env_ll("FAKE_NVML_POWER_HANG_GPU", -1) == d->index) {
        log_call("nvmlDeviceGetPowerUsage-hang");
        usleep((useconds_t)(env_ll("FAKE_NVML_HANG_MS", 30000) * 1000));
    }
    *milliwatts = 250000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *celsius) {
    if (!valid(d) || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *celsius = 45;
    return NVML_SUCCESS;
}
