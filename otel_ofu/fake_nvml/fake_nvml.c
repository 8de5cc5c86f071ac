/*
 * A fake NVML: the entry points pynvml (nvidia-ml-py) calls for the otel-ofu NVML source, with the
 * struct layouts of nvml.h as pynvml declares them, plus a small control API (fake_*) that tests and
 * the demo call through ctypes to script devices, values and faults.
 *
 * Built by otel_ofu/testing/fake_nvml.py with `gcc -shared -fPIC`. It is loaded into the process
 * that uses pynvml, and pynvml is pointed at it (otel_ofu.sources.nvml.use_library), so the control
 * calls and the NVML calls share this one state. One global mutex guards everything, because the NVML
 * source samples clocks from a background thread while tests script values.
 *
 * Errors on demand: fake_fail(entry, device, code, times) makes the named entry point (the NVML symbol
 * without its _vN suffix, e.g. "nvmlDeviceGetClockInfo", "nvmlInit" for both init variants, or "*"
 * for every entry point) return `code` for `device` (-1: every device and the calls that take none),
 * `times` times (-1: until cleared with code 0).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t; /* an enum in nvml.h: int-sized */

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};

#define MAX_DEVICES 16
#define MAX_MIG 7 /* MIG slots per GPU; unit 0 is the whole GPU, units 1..7 the MIG instances */
#define MAX_METRIC 512 /* above pynvml's NVML_GPM_METRIC_MAX (477) */
#define MAX_CLOCK_SEQ 1024
#define MAX_PROCS 64
#define MAX_FAILS 64
#define TEXT 96
#define SAMPLE_MAGIC 0x47504d53 /* "GPMS" */
#define NOT_AVAILABLE_U32 0xFFFFFFFFu

/* --- nvml.h layouts, as pynvml declares them --------------------------------------------------- */

struct nvmlDevice_st {
    int dev;  /* GPU position */
    int unit; /* 0: the GPU itself; 1..MAX_MIG: a MIG device handle */
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct nvmlGpmSample_st {
    int magic;
    int taken;
    int dev;
    int unit;
    double counter[MAX_METRIC];
} *nvmlGpmSample_t;

typedef struct {
    char *shortName;
    char *longName;
    char *unit;
} nvmlGpmMetricInfo_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version; /* NVML_GPM_METRICS_GET_VERSION = 1 */
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[]; /* NVML_GPM_METRIC_MAX entries in the caller's struct; numMetrics used */
} nvmlGpmMetricsGet_t;

typedef struct {
    unsigned int version; /* NVML_GPM_SUPPORT_VERSION = 1 */
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t; /* nvmlProcessInfo_v2_t, which pynvml uses for the _v3 call */

typedef struct {
    unsigned long long referenceTime; /* CPU timestamp in microseconds */
    unsigned long long violationTime; /* nanoseconds, cumulative */
} nvmlViolationTime_t;

#define MAX_POLICY 12 /* NVML_PERF_POLICY_COUNT */

_Static_assert(sizeof(nvmlViolationTime_t) == 16, "nvmlViolationTime_t size");
_Static_assert(offsetof(nvmlGpmMetric_t, value) == 8, "nvmlGpmMetric_t.value offset");
_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t size");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "nvmlGpmMetricsGet_t.metrics offset");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t size");

/* --- fake state --------------------------------------------------------------------------------- */

enum { METRIC_NONE = 0, METRIC_RATE = 1, METRIC_COUNTER = 2 };

typedef struct {
    int used;
    unsigned int gi_id;
    char uuid[TEXT];
    char name[TEXT];
    unsigned char kind[MAX_METRIC];
    double value[MAX_METRIC];   /* rate metrics: what nvmlGpmMetricsGet reports */
    double counter[MAX_METRIC]; /* counter metrics: cumulative; metrics report the delta of two samples */
    int ret[MAX_METRIC];        /* per-metric nvmlReturn, 0 = success */
    unsigned int pids[MAX_PROCS];
    int npids;
} unit_t;

typedef struct {
    char uuid[TEXT];
    char name[TEXT];
    unsigned int index;
    unsigned int clock_mhz;
    unsigned int max_clock_mhz;
    unsigned int clock_seq[MAX_CLOCK_SEQ];
    int clock_seq_len;
    int clock_seq_pos;
    unsigned long clock_calls;
    int gpm_supported;
    int mig_mode; /* -1: not MIG capable, 0: disabled, 1: enabled */
    unit_t units[1 + MAX_MIG];
    /* Power, energy and clock events; each is NOT_SUPPORTED until a fake_* call gives it a value. */
    int power_supported;
    unsigned int power_mw;
    int energy_supported;
    unsigned long long energy_mj;
    int reasons_supported;
    unsigned long long reasons;
    int violation_supported[MAX_POLICY];
    unsigned long long violation_ns[MAX_POLICY];
    unsigned long long reference_us;
} device_t;

typedef struct {
    char entry[64];
    int dev;
    int code;
    int times;
} failure_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static device_t devices[MAX_DEVICES];
static struct nvmlDevice_st handles[MAX_DEVICES][1 + MAX_MIG];
static int device_count;
static int init_count;
static failure_t failures[MAX_FAILS];
static int failure_count;
static long live_samples;
static char driver_version[TEXT] = "999.99-fake";
static char metric_short[] = "fake";
static char metric_unit[] = "%";
static char metric_rate_unit[] = "MiB/s";

/* The unit nvml.h gives a GPM metric: MiB/s for the PCIe (20, 21) and NVLink (60..247) throughput, % else. */
static char *metric_unit_of(unsigned int id) {
    return id == 20 || id == 21 || (id >= 60 && id <= 247) ? metric_rate_unit : metric_unit;
}

/* The code an entry point returns for a device now, consuming one of a counted failure. Locked. */
static int failure_for(const char *entry, int dev) {
    for (int i = 0; i < failure_count; i++) {
        failure_t *f = &failures[i];
        int entry_matches = strcmp(f->entry, "*") == 0 || strcmp(f->entry, entry) == 0;
        int dev_matches = f->dev == -1 || f->dev == dev;
        if (!entry_matches || !dev_matches) continue;
        int code = f->code;
        if (f->times > 0 && --f->times == 0) {
            failures[i] = failures[--failure_count];
        }
        return code;
    }
    return NVML_SUCCESS;
}

static int valid_handle(nvmlDevice_t h) {
    if (h == NULL) return 0;
    for (int d = 0; d < device_count; d++) {
        for (int u = 0; u <= MAX_MIG; u++) {
            if (h == &handles[d][u]) return u == 0 || devices[d].units[u].used;
        }
    }
    return 0;
}

/* Common prologue of a device entry point: initialized, a live handle, no scripted failure. */
static int device_check(const char *entry, nvmlDevice_t h) {
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!valid_handle(h)) return NVML_ERROR_INVALID_ARGUMENT;
    return failure_for(entry, h->dev);
}

#define LOCKED_RETURN(expr)          \
    do {                             \
        nvmlReturn_t r_ = (expr);    \
        pthread_mutex_unlock(&lock); \
        return r_;                   \
    } while (0)

/* Copies text, truncated to fit like NVML's own string getters. */
static void copy_text(char *out, unsigned int length, const char *text) {
    if (length == 0) return;
    size_t n = strlen(text);
    if (n >= length) n = length - 1;
    memcpy(out, text, n);
    out[n] = '\0';
}

static int find_unit(int dev, int gi_id) {
    if (gi_id < 0) return 0;
    for (int u = 1; u <= MAX_MIG; u++) {
        if (devices[dev].units[u].used && devices[dev].units[u].gi_id == (unsigned int)gi_id) return u;
    }
    return -1;
}

/* --- NVML: init and system ---------------------------------------------------------------------- */

static nvmlReturn_t init_locked(void) {
    int code = failure_for("nvmlInit", -1);
    if (code != NVML_SUCCESS) return code;
    init_count++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    LOCKED_RETURN(init_locked());
}

nvmlReturn_t nvmlInit_v2(void) {
    pthread_mutex_lock(&lock);
    LOCKED_RETURN(init_locked());
}

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (init_count <= 0) LOCKED_RETURN(NVML_ERROR_UNINITIALIZED);
    int code = failure_for("nvmlShutdown", -1);
    if (code == NVML_SUCCESS) init_count--;
    LOCKED_RETURN(code);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
        case 0: return "Success";
        case 1: return "Uninitialized";
        case 2: return "Invalid Argument";
        case 3: return "Not Supported";
        case 4: return "Insufficient Permissions";
        case 6: return "Not Found";
        case 7: return "Insufficient Size";
        case 9: return "Driver Not Loaded";
        case 15: return "GPU is lost";
        case 21: return "No data";
        case 25: return "Argument version mismatch";
        default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    pthread_mutex_lock(&lock);
    if (init_count <= 0) LOCKED_RETURN(NVML_ERROR_UNINITIALIZED);
    int code = failure_for("nvmlSystemGetDriverVersion", -1);
    if (code == NVML_SUCCESS) copy_text(version, length, driver_version);
    LOCKED_RETURN(code);
}

/* --- NVML: devices ------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    pthread_mutex_lock(&lock);
    if (init_count <= 0) LOCKED_RETURN(NVML_ERROR_UNINITIALIZED);
    int code = failure_for("nvmlDeviceGetCount", -1);
    if (code == NVML_SUCCESS) *count = (unsigned int)device_count;
    LOCKED_RETURN(code);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    if (init_count <= 0) LOCKED_RETURN(NVML_ERROR_UNINITIALIZED);
    if (index >= (unsigned int)device_count) LOCKED_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    int code = failure_for("nvmlDeviceGetHandleByIndex", (int)index);
    if (code == NVML_SUCCESS) *device = &handles[index][0];
    LOCKED_RETURN(code);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    if (init_count <= 0) LOCKED_RETURN(NVML_ERROR_UNINITIALIZED);
    for (int d = 0; d < device_count; d++) {
        for (int u = 0; u <= MAX_MIG; u++) {
            const char *candidate = u == 0 ? devices[d].uuid : devices[d].units[u].uuid;
            if ((u == 0 || devices[d].units[u].used) && strcmp(candidate, uuid) == 0) {
                int code = failure_for("nvmlDeviceGetHandleByUUID", d);
                if (code == NVML_SUCCESS) *device = &handles[d][u];
                LOCKED_RETURN(code);
            }
        }
    }
    LOCKED_RETURN(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetUUID", device);
    if (code == NVML_SUCCESS) {
        device_t *d = &devices[device->dev];
        copy_text(uuid, length, device->unit == 0 ? d->uuid : d->units[device->unit].uuid);
    }
    LOCKED_RETURN(code);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetName", device);
    if (code == NVML_SUCCESS) {
        device_t *d = &devices[device->dev];
        copy_text(name, length, device->unit == 0 ? d->name : d->units[device->unit].name);
    }
    LOCKED_RETURN(code);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetIndex", device);
    if (code == NVML_SUCCESS) *index = devices[device->dev].index;
    LOCKED_RETURN(code);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetClockInfo", device);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    if (type != 0 && type != 1) LOCKED_RETURN(NVML_ERROR_NOT_SUPPORTED); /* graphics and SM only */
    device_t *d = &devices[device->dev];
    d->clock_calls++;
    if (d->clock_seq_pos < d->clock_seq_len) d->clock_mhz = d->clock_seq[d->clock_seq_pos++];
    *clock = d->clock_mhz;
    LOCKED_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetMaxClockInfo", device);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    if (type != 0 && type != 1) LOCKED_RETURN(NVML_ERROR_NOT_SUPPORTED);
    *clock = devices[device->dev].max_clock_mhz;
    LOCKED_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_t *infos) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetComputeRunningProcesses", device);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    device_t *d = &devices[device->dev];
    /* A GPU handle sees the processes of the whole GPU and of all its MIG instances. */
    int first = device->unit, last = device->unit == 0 ? MAX_MIG : device->unit;
    unsigned int needed = 0;
    for (int u = first; u <= last; u++) {
        if (u == 0 || d->units[u].used) needed += (unsigned int)d->units[u].npids;
    }
    if (infos == NULL || *count < needed) {
        unsigned int had = *count;
        *count = needed;
        LOCKED_RETURN(needed == 0 && had == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int n = 0;
    for (int u = first; u <= last; u++) {
        unit_t *unit = &d->units[u];
        if (u != 0 && !unit->used) continue;
        for (int p = 0; p < unit->npids; p++, n++) {
            infos[n].pid = unit->pids[p];
            infos[n].usedGpuMemory = 1ull << 30;
            infos[n].gpuInstanceId = u == 0 ? NOT_AVAILABLE_U32 : unit->gi_id;
            infos[n].computeInstanceId = u == 0 ? NOT_AVAILABLE_U32 : 0;
        }
    }
    *count = n;
    LOCKED_RETURN(NVML_SUCCESS);
}

/* --- NVML: power, energy, clock events -------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetPowerUsage", device);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    device_t *d = &devices[device->dev];
    if (device->unit != 0 || !d->power_supported) LOCKED_RETURN(NVML_ERROR_NOT_SUPPORTED);
    *milliwatts = d->power_mw;
    LOCKED_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *millijoules) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetTotalEnergyConsumption", device);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    device_t *d = &devices[device->dev];
    if (device->unit != 0 || !d->energy_supported) LOCKED_RETURN(NVML_ERROR_NOT_SUPPORTED);
    *millijoules = d->energy_mj;
    LOCKED_RETURN(NVML_SUCCESS);
}

static nvmlReturn_t event_reasons(const char *entry, nvmlDevice_t device, unsigned long long *reasons) {
    int code = device_check(entry, device);
    if (code != NVML_SUCCESS) return code;
    device_t *d = &devices[device->dev];
    if (device->unit != 0 || !d->reasons_supported) return NVML_ERROR_NOT_SUPPORTED;
    *reasons = d->reasons;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    pthread_mutex_lock(&lock);
    LOCKED_RETURN(event_reasons("nvmlDeviceGetCurrentClocksEventReasons", device, reasons));
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    pthread_mutex_lock(&lock);
    LOCKED_RETURN(event_reasons("nvmlDeviceGetCurrentClocksThrottleReasons", device, reasons));
}

nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, int policy, nvmlViolationTime_t *violation) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetViolationStatus", device);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    device_t *d = &devices[device->dev];
    if (policy < 0 || policy >= MAX_POLICY) LOCKED_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (device->unit != 0 || !d->violation_supported[policy]) LOCKED_RETURN(NVML_ERROR_NOT_SUPPORTED);
    violation->referenceTime = d->reference_us;
    violation->violationTime = d->violation_ns[policy];
    LOCKED_RETURN(NVML_SUCCESS);
}

/* --- NVML: MIG ---------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetMigMode", device);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    device_t *d = &devices[device->dev];
    if (device->unit != 0 || d->mig_mode < 0) LOCKED_RETURN(NVML_ERROR_NOT_SUPPORTED);
    *current = (unsigned int)d->mig_mode;
    *pending = (unsigned int)d->mig_mode;
    LOCKED_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetMaxMigDeviceCount", device);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    if (device->unit != 0 || devices[device->dev].mig_mode < 0) LOCKED_RETURN(NVML_ERROR_NOT_SUPPORTED);
    *count = MAX_MIG;
    LOCKED_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetMigDeviceHandleByIndex", device);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    device_t *d = &devices[device->dev];
    if (device->unit != 0 || d->mig_mode != 1 || index >= MAX_MIG) LOCKED_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->units[index + 1].used) LOCKED_RETURN(NVML_ERROR_NOT_FOUND);
    *mig = &handles[device->dev][index + 1];
    LOCKED_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceIsMigDeviceHandle", device);
    if (code == NVML_SUCCESS) *is_mig = device->unit != 0;
    LOCKED_RETURN(code);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetGpuInstanceId", device);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    if (device->unit == 0) LOCKED_RETURN(NVML_ERROR_NOT_SUPPORTED);
    *id = devices[device->dev].units[device->unit].gi_id;
    LOCKED_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    if (mig->unit == 0) LOCKED_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *device = &handles[mig->dev][0];
    LOCKED_RETURN(NVML_SUCCESS);
}

/* --- NVML: GPM ---------------------------------------------------------------------------------- */

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    pthread_mutex_lock(&lock);
    int code = device_check("nvmlGpmQueryDeviceSupport", device);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    if (support->version != 1) LOCKED_RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    support->isSupportedDevice = (unsigned int)devices[device->dev].gpm_supported;
    LOCKED_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    pthread_mutex_lock(&lock);
    if (init_count <= 0) LOCKED_RETURN(NVML_ERROR_UNINITIALIZED);
    int code = failure_for("nvmlGpmSampleAlloc", -1);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    nvmlGpmSample_t s = calloc(1, sizeof *s);
    if (s == NULL) LOCKED_RETURN(20); /* NVML_ERROR_MEMORY */
    s->magic = SAMPLE_MAGIC;
    live_samples++;
    *sample = s;
    LOCKED_RETURN(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    pthread_mutex_lock(&lock);
    if (sample == NULL || sample->magic != SAMPLE_MAGIC) LOCKED_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    sample->magic = 0;
    free(sample);
    live_samples--;
    LOCKED_RETURN(NVML_SUCCESS);
}

static nvmlReturn_t take_sample(const char *entry, nvmlDevice_t device, int gi_id, nvmlGpmSample_t sample) {
    int code = device_check(entry, device);
    if (code != NVML_SUCCESS) return code;
    if (sample == NULL || sample->magic != SAMPLE_MAGIC || device->unit != 0) return NVML_ERROR_INVALID_ARGUMENT;
    device_t *d = &devices[device->dev];
    if (!d->gpm_supported) return NVML_ERROR_NOT_SUPPORTED;
    int unit = find_unit(device->dev, gi_id);
    if (unit < 0) return NVML_ERROR_NOT_FOUND;
    memcpy(sample->counter, d->units[unit].counter, sizeof sample->counter);
    sample->taken = 1;
    sample->dev = device->dev;
    sample->unit = unit;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    pthread_mutex_lock(&lock);
    LOCKED_RETURN(take_sample("nvmlGpmSampleGet", device, -1, sample));
}

nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t sample) {
    pthread_mutex_lock(&lock);
    LOCKED_RETURN(take_sample("nvmlGpmMigSampleGet", device, (int)gpuInstanceId, sample));
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *request) {
    pthread_mutex_lock(&lock);
    if (init_count <= 0) LOCKED_RETURN(NVML_ERROR_UNINITIALIZED);
    if (request->version != 1) LOCKED_RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    nvmlGpmSample_t s1 = request->sample1, s2 = request->sample2;
    if (s1 == NULL || s2 == NULL || s1->magic != SAMPLE_MAGIC || s2->magic != SAMPLE_MAGIC || !s1->taken ||
        !s2->taken || s1->dev != s2->dev || s1->unit != s2->unit || request->numMetrics > MAX_METRIC) {
        LOCKED_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    }
    int code = failure_for("nvmlGpmMetricsGet", s1->dev);
    if (code != NVML_SUCCESS) LOCKED_RETURN(code);
    unit_t *unit = &devices[s1->dev].units[s1->unit];
    for (unsigned int i = 0; i < request->numMetrics; i++) {
        nvmlGpmMetric_t *m = &request->metrics[i];
        unsigned int id = m->metricId;
        m->value = 0.0;
        m->metricInfo.shortName = metric_short;
        m->metricInfo.longName = metric_short;
        m->metricInfo.unit = metric_unit_of(id);
        if (id >= MAX_METRIC || unit->kind[id] == METRIC_NONE) {
            m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        } else if (unit->ret[id] != NVML_SUCCESS) {
            m->nvmlReturn = unit->ret[id];
        } else {
            m->nvmlReturn = NVML_SUCCESS;
            m->value = unit->kind[id] == METRIC_COUNTER ? s2->counter[id] - s1->counter[id] : unit->value[id];
        }
    }
    LOCKED_RETURN(NVML_SUCCESS);
}

/* --- control API (fake_*), called by otel_ofu.testing.fake_nvml through ctypes ----------------- */
/* Each returns 0, or -1 for an argument out of range. */

int fake_reset(void) {
    pthread_mutex_lock(&lock);
    memset(devices, 0, sizeof devices);
    for (int d = 0; d < MAX_DEVICES; d++) {
        for (int u = 0; u <= MAX_MIG; u++) {
            handles[d][u].dev = d;
            handles[d][u].unit = u;
        }
    }
    device_count = 0;
    init_count = 0;
    failure_count = 0;
    pthread_mutex_unlock(&lock);
    return 0;
}

int fake_add_device(const char *uuid, const char *name, unsigned int max_clock_mhz, unsigned int clock_mhz,
                    int gpm_supported) {
    pthread_mutex_lock(&lock);
    if (device_count >= MAX_DEVICES) LOCKED_RETURN(-1);
    int dev = device_count++;
    device_t *d = &devices[dev];
    memset(d, 0, sizeof *d);
    copy_text(d->uuid, TEXT, uuid);
    copy_text(d->name, TEXT, name);
    d->index = (unsigned int)dev;
    d->max_clock_mhz = max_clock_mhz;
    d->clock_mhz = clock_mhz;
    d->gpm_supported = gpm_supported;
    d->mig_mode = 0;
    d->units[0].used = 1;
    LOCKED_RETURN(dev);
}

static int device_ok(int dev) { return dev >= 0 && dev < device_count; }

int fake_set_clock(int dev, unsigned int clock_mhz, unsigned int max_clock_mhz) {
    pthread_mutex_lock(&lock);
    if (!device_ok(dev)) LOCKED_RETURN(-1);
    devices[dev].clock_mhz = clock_mhz;
    if (max_clock_mhz != 0) devices[dev].max_clock_mhz = max_clock_mhz; /* 0: unchanged */
    devices[dev].clock_seq_len = devices[dev].clock_seq_pos = 0;
    LOCKED_RETURN(0);
}

/* The next len nvmlDeviceGetClockInfo calls return these, one each; the last one then stays. */
int fake_schedule_clocks(int dev, const unsigned int *mhz, int len) {
    pthread_mutex_lock(&lock);
    if (!device_ok(dev) || len < 0 || len > MAX_CLOCK_SEQ) LOCKED_RETURN(-1);
    memcpy(devices[dev].clock_seq, mhz, (size_t)len * sizeof *mhz);
    devices[dev].clock_seq_len = len;
    devices[dev].clock_seq_pos = 0;
    LOCKED_RETURN(0);
}

long fake_clock_calls(int dev) {
    pthread_mutex_lock(&lock);
    long calls = device_ok(dev) ? (long)devices[dev].clock_calls : -1;
    pthread_mutex_unlock(&lock);
    return calls;
}

/* Power usage in mW from now on; makes nvmlDeviceGetPowerUsage supported. */
int fake_set_power(int dev, unsigned int milliwatts) {
    pthread_mutex_lock(&lock);
    if (!device_ok(dev)) LOCKED_RETURN(-1);
    devices[dev].power_supported = 1;
    devices[dev].power_mw = milliwatts;
    LOCKED_RETURN(0);
}

/* Advances the total energy counter (mJ); makes nvmlDeviceGetTotalEnergyConsumption supported. */
int fake_advance_energy(int dev, unsigned long long millijoules) {
    pthread_mutex_lock(&lock);
    if (!device_ok(dev)) LOCKED_RETURN(-1);
    devices[dev].energy_supported = 1;
    devices[dev].energy_mj += millijoules;
    LOCKED_RETURN(0);
}

/* Sets the energy counter outright (a driver reload starts it again from 0). */
int fake_set_energy(int dev, unsigned long long millijoules) {
    pthread_mutex_lock(&lock);
    if (!device_ok(dev)) LOCKED_RETURN(-1);
    devices[dev].energy_supported = 1;
    devices[dev].energy_mj = millijoules;
    LOCKED_RETURN(0);
}

/* The clocks event reasons bitmask from now on; makes both reasons entry points supported. */
int fake_set_event_reasons(int dev, unsigned long long reasons) {
    pthread_mutex_lock(&lock);
    if (!device_ok(dev)) LOCKED_RETURN(-1);
    devices[dev].reasons_supported = 1;
    devices[dev].reasons = reasons;
    LOCKED_RETURN(0);
}

/* Advances a perf policy's violation time (ns) and the reference time (us); makes the policy supported. */
int fake_advance_violation(int dev, int policy, unsigned long long ns, unsigned long long reference_us) {
    pthread_mutex_lock(&lock);
    if (!device_ok(dev) || policy < 0 || policy >= MAX_POLICY) LOCKED_RETURN(-1);
    devices[dev].violation_supported[policy] = 1;
    devices[dev].violation_ns[policy] += ns;
    devices[dev].reference_us += reference_us;
    LOCKED_RETURN(0);
}

int fake_set_gpm_supported(int dev, int supported) {
    pthread_mutex_lock(&lock);
    if (!device_ok(dev)) LOCKED_RETURN(-1);
    devices[dev].gpm_supported = supported;
    LOCKED_RETURN(0);
}

int fake_set_mig_mode(int dev, int mode) {
    pthread_mutex_lock(&lock);
    if (!device_ok(dev) || mode < -1 || mode > 1) LOCKED_RETURN(-1);
    devices[dev].mig_mode = mode;
    LOCKED_RETURN(0);
}

/* A MIG instance in the first free slot; enables MIG mode on the GPU. */
int fake_add_mig(int dev, unsigned int gi_id, const char *uuid, const char *profile) {
    pthread_mutex_lock(&lock);
    if (!device_ok(dev) || find_unit(dev, (int)gi_id) > 0) LOCKED_RETURN(-1);
    device_t *d = &devices[dev];
    for (int u = 1; u <= MAX_MIG; u++) {
        unit_t *unit = &d->units[u];
        if (unit->used) continue;
        memset(unit, 0, sizeof *unit);
        unit->used = 1;
        unit->gi_id = gi_id;
        copy_text(unit->uuid, TEXT, uuid);
        char name[2 * TEXT];
        snprintf(name, sizeof name, "%s MIG %s", d->name, profile);
        copy_text(unit->name, TEXT, name);
        d->mig_mode = 1;
        LOCKED_RETURN(0);
    }
    LOCKED_RETURN(-1);
}

/* The unit a metric or process list belongs to: the GPU for gi_id -1, else its MIG instance. Locked. */
static unit_t *unit_of(int dev, int gi_id) {
    if (!device_ok(dev)) return NULL;
    int u = find_unit(dev, gi_id);
    return u < 0 ? NULL : &devices[dev].units[u];
}

/* A rate metric (0..100 for the *_UTIL ones): what nvmlGpmMetricsGet reports for it. gi_id -1: the GPU. */
int fake_set_metric(int dev, int gi_id, unsigned int metric, double value) {
    pthread_mutex_lock(&lock);
    unit_t *unit = unit_of(dev, gi_id);
    if (unit == NULL || metric >= MAX_METRIC) LOCKED_RETURN(-1);
    unit->kind[metric] = METRIC_RATE;
    unit->value[metric] = value;
    LOCKED_RETURN(0);
}

/* Advances a cumulative counter metric; nvmlGpmMetricsGet reports its increase between the two samples. */
int fake_advance_counter(int dev, int gi_id, unsigned int metric, double delta) {
    pthread_mutex_lock(&lock);
    unit_t *unit = unit_of(dev, gi_id);
    if (unit == NULL || metric >= MAX_METRIC) LOCKED_RETURN(-1);
    unit->kind[metric] = METRIC_COUNTER;
    unit->counter[metric] += delta;
    LOCKED_RETURN(0);
}

/* The metric's own nvmlReturn in nvmlGpmMetricsGet results (0 clears); the call itself still succeeds. */
int fake_fail_metric(int dev, int gi_id, unsigned int metric, int code) {
    pthread_mutex_lock(&lock);
    unit_t *unit = unit_of(dev, gi_id);
    if (unit == NULL || metric >= MAX_METRIC) LOCKED_RETURN(-1);
    unit->ret[metric] = code;
    LOCKED_RETURN(0);
}

int fake_set_processes(int dev, int gi_id, const unsigned int *pids, int len) {
    pthread_mutex_lock(&lock);
    unit_t *unit = unit_of(dev, gi_id);
    if (unit == NULL || len < 0 || len > MAX_PROCS) LOCKED_RETURN(-1);
    memcpy(unit->pids, pids, (size_t)len * sizeof *pids);
    unit->npids = len;
    LOCKED_RETURN(0);
}

/* Scripted failure of an entry point (see the top of this file); code 0 removes the matching ones. */
int fake_fail(const char *entry, int dev, int code, int times) {
    pthread_mutex_lock(&lock);
    if (strlen(entry) >= sizeof failures[0].entry || dev < -1 || times == 0) LOCKED_RETURN(-1);
    for (int i = 0; i < failure_count;) {
        if (strcmp(failures[i].entry, entry) == 0 && failures[i].dev == dev) {
            failures[i] = failures[--failure_count];
        } else {
            i++;
        }
    }
    if (code == NVML_SUCCESS) LOCKED_RETURN(0);
    if (failure_count >= MAX_FAILS) LOCKED_RETURN(-1);
    failure_t *f = &failures[failure_count++];
    copy_text(f->entry, sizeof f->entry, entry);
    f->dev = dev;
    f->code = code;
    f->times = times;
    LOCKED_RETURN(0);
}

int fake_clear_failures(void) {
    pthread_mutex_lock(&lock);
    failure_count = 0;
    pthread_mutex_unlock(&lock);
    return 0;
}

int fake_init_count(void) {
    pthread_mutex_lock(&lock);
    int count = init_count;
    pthread_mutex_unlock(&lock);
    return count;
}

long fake_live_samples(void) {
    pthread_mutex_lock(&lock);
    long count = live_samples;
    pthread_mutex_unlock(&lock);
    return count;
}

/* Layout checks against pynvml's ctypes declarations: 0 gpm metric, 1 metrics-get header, 2 process info. */
long fake_sizeof(int which) {
    switch (which) {
        case 0: return (long)sizeof(nvmlGpmMetric_t);
        case 1: return (long)offsetof(nvmlGpmMetricsGet_t, metrics);
        case 2: return (long)sizeof(nvmlProcessInfo_t);
        case 3: return (long)sizeof(nvmlGpmSupport_t);
        case 4: return (long)sizeof(nvmlViolationTime_t);
        default: return -1;
    }
}
