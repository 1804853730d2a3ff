/* /proc/meminfo reading, separate so tests can feed it sample files. */
#ifndef VMMARENA_MEMINFO_H
#define VMMARENA_MEMINFO_H
#include <stddef.h>
#include "vmmarena.h"

/* Parses "MemAvailable: <n> kB" out of meminfo text. 0 on success, -1 if absent or malformed. */
VMM_API int vmm_meminfo_parse(const char *text, size_t len, size_t *available);
/* Reads and parses a meminfo file (at most its first 8 KiB). */
VMM_API int vmm_meminfo_read(const char *path, size_t *available);
#endif
