/*
 * The NVML entry points OpenLIT's GPU instrumentation reads that the project's fake NVML does not have
 * (temperature, utilisation, encoder/decoder utilisation, memory, power), with nvml.h's layouts as
 * pynvml declares them. Compiled into ONE library together with the fake NVML (this file includes its
 * source), so OpenLIT and the otel-ofu NVML source read the same fake GPUs in the same process; the
 * values are fixed per GPU (the benchmark times the reads, not the readings).
 */
#include "fake_nvml.c"

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

static nvmlReturn_t bench_check(nvmlDevice_t device, const void *out) {
    if (device == NULL || out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    nvmlReturn_t rc = bench_check(device, temp);
    if (rc == NVML_SUCCESS) *temp = 60u + (unsigned int)device->dev;
    return rc;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    nvmlReturn_t rc = bench_check(device, util);
    if (rc == NVML_SUCCESS) {
        util->gpu = 90u;
        util->memory = 40u;
    }
    return rc;
}

static nvmlReturn_t bench_codec(nvmlDevice_t device, unsigned int *util, unsigned int *period) {
    nvmlReturn_t rc = bench_check(device, util);
    if (rc == NVML_SUCCESS && period != NULL) {
        *util = 0u;
        *period = 167000u;
    }
    return rc;
}

nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *util, unsigned int *period) {
    return bench_codec(device, util, period);
}

nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *util, unsigned int *period) {
    return bench_codec(device, util, period);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t rc = bench_check(device, memory);
    if (rc == NVML_SUCCESS) {
        memory->total = 85899345920ull;
        memory->used = 64424509440ull;
        memory->free = memory->total - memory->used;
    }
    return rc;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts) {
    nvmlReturn_t rc = bench_check(device, milliwatts);
    if (rc == NVML_SUCCESS) *milliwatts = 550000u + 1000u * (unsigned int)device->dev;
    return rc;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *milliwatts) {
    nvmlReturn_t rc = bench_check(device, milliwatts);
    if (rc == NVML_SUCCESS) *milliwatts = 700000u;
    return rc;
}
