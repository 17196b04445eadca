/* A stand-in for the NVIDIA driver's libnvidia-ml.so.1, built by tests/test_device_use_local.py:
 * the calls parcel_hpc/worker/devices.py makes, answering for two GPUs ("GPU-fake-0", "GPU-fake-1",
 * indices 0 and 1) at the utilization FAKE_NVML_UTILIZATION gives (percent, default 37; "40,70": each device's). */
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned int gpu; unsigned int memory; } utilization_t;
static int devices[2] = {0, 1};

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    if (index > 1) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *handle = &devices[index];
    return 0;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, void **handle) {
    if (strcmp(uuid, "GPU-fake-0") == 0) { *handle = &devices[0]; return 0; }
    if (strcmp(uuid, "GPU-fake-1") == 0) { *handle = &devices[1]; return 0; }
    return 6; /* NVML_ERROR_NOT_FOUND */
}

int nvmlDeviceGetUtilizationRates(void *handle, utilization_t *rates) {
    /* "40" for every device, or "40,70": device 0's, then device 1's */
    const char *given = getenv("FAKE_NVML_UTILIZATION");
    if (given && *(int *)handle == 1 && strchr(given, ',')) given = strchr(given, ',') + 1;
    rates->gpu = given ? (unsigned int)atoi(given) : 37;
    rates->memory = 5;
    return 0;
}

int nvmlDeviceGetName(void *handle, char *name, unsigned int length) {
    strncpy(name, *(int *)handle == 0 ? "Fake GPU 0" : "Fake GPU 1", length);
    return 0;
}
