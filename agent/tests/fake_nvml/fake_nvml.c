/* A stand-in for libnvidia-ml.so with two GPUs, for testing the nvml
 * backend without a driver. Units follow NVML: power in milliwatts, memory in
 * bytes, temperatures in degrees C. Functions it does not define come back
 * from nvml-wrapper as FailedToLoadSymbol, as on an old driver. */
#include <string.h>
#include <unistd.h>

/* While this file exists, GPU 1 has "fallen off the bus": every reading of
 * it answers NVML_ERROR_GPU_IS_LOST, as after an XID 79. The test builds the
 * library with its own path. */
#ifndef FAKE_LOST_PATH
#define FAKE_LOST_PATH "/nonexistent/fake-nvml-lost"
#endif
#define NVML_ERROR_GPU_IS_LOST 15

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4

typedef struct {
    const char *name;
    const char *uuid;
    unsigned int power_mw, limit_mw, min_mw, max_mw, default_mw;
    int fans; /* -1: not supported */
    unsigned int fan_pct, fan_default;
    unsigned int temp_c;
    unsigned long long mem_total, mem_used;
    unsigned int util;
    unsigned int sm_mhz, sm_max_mhz;
    unsigned long long ecc_dbe, ecc_sbe;
    unsigned long long throttle;
    int power_set_permission;
} fake_gpu;

static fake_gpu gpus[2] = {
    {"NVIDIA H100 80GB HBM3", "GPU-fake-0000", 612345, 700000, 200000, 700000, 700000, -1, 0, 0, 71,
     85899345920ULL, 42949672960ULL, 93, 1755, 1980, 2, 5, 0x84ULL, 1},
    {"NVIDIA RTX 6000 Ada Generation", "GPU-fake-0001", 250000, 300000, 100000, 300000, 300000, 1, 41, 1, 66,
     51527024640ULL, 12884901888ULL, 40, 2100, 2505, 0, 0, 0x40ULL, 0},
};

typedef fake_gpu *nvmlDevice_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

static int valid(nvmlDevice_t d) { return d == &gpus[0] || d == &gpus[1]; }
static int lost(nvmlDevice_t d) { return d == &gpus[1] && access(FAKE_LOST_PATH, F_OK) == 0; }

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { strncpy(v, "550.54.15", n); return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i > 1) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &gpus[i];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int n) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    strncpy(name, d->name, n);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int n) {
    strncpy(uuid, d->uuid, n);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t d, unsigned int *min, unsigned int *max) {
    *min = d->min_mw; *max = d->max_mw; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t d, unsigned int *v) { *v = d->default_mw; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *v) { *v = d->limit_mw; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *v) { *v = d->limit_mw; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t d, unsigned int mw) {
    if (!d->power_set_permission) return NVML_ERROR_NO_PERMISSION;
    if (mw < d->min_mw || mw > d->max_mw) return NVML_ERROR_INVALID_ARGUMENT;
    d->limit_mw = mw;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *v) { if (lost(d)) return NVML_ERROR_GPU_IS_LOST; *v = d->power_mw; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t d, unsigned int *n) {
    if (d->fans < 0) return NVML_ERROR_NOT_SUPPORTED;
    *n = (unsigned int)d->fans;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t d, unsigned int fan, unsigned int *v) {
    if (d->fans <= 0 || fan >= (unsigned int)d->fans) return NVML_ERROR_NOT_SUPPORTED;
    *v = d->fan_pct; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceSetFanSpeed_v2(nvmlDevice_t d, unsigned int fan, unsigned int pct) {
    if (d->fans <= 0 || fan >= (unsigned int)d->fans) return NVML_ERROR_NOT_SUPPORTED;
    d->fan_pct = pct; d->fan_default = 0; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceSetDefaultFanSpeed_v2(nvmlDevice_t d, unsigned int fan) {
    if (d->fans <= 0 || fan >= (unsigned int)d->fans) return NVML_ERROR_NOT_SUPPORTED;
    d->fan_pct = 41; d->fan_default = 1; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *v) {
    if (lost(d)) return NVML_ERROR_GPU_IS_LOST;
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *v = d->temp_c; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t d, int kind, unsigned int *v) {
    if (kind == 0) { *v = 97; return NVML_SUCCESS; }
    if (kind == 1) { *v = 92; return NVML_SUCCESS; }
    /* NVML_TEMPERATURE_THRESHOLD_MEM_MAX: the HBM board only. */
    if (kind == 2 && d == &gpus[0]) { *v = 95; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if ((m->version >> 24) != 2) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = d->mem_total; m->used = d->mem_used; m->reserved = 0; m->free = d->mem_total - d->mem_used;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) { u->gpu = d->util; u->memory = 30; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *v) { (void)type; *v = d->sm_mhz; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned int *v) { (void)type; *v = d->sm_max_mhz; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int err, int counter, unsigned long long *v) {
    (void)counter;
    *v = err == 1 ? d->ecc_dbe : d->ecc_sbe;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceClearEccErrorCounts(nvmlDevice_t d, int counter) {
    (void)counter; d->ecc_dbe = 0; d->ecc_sbe = 0; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *v) { *v = d->throttle; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active) {
    (void)d; (void)link; (void)active; return NVML_ERROR_NOT_SUPPORTED;
}
