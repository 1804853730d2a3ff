/* /proc/meminfo reading, separate so tests can feed it sample files. Private: not exported
 * from libvmmarena.so (the tests link the static library). */
#ifndef VMMARENA_MEMINFO_H
#define VMMARENA_MEMINFO_H
#include <stddef.h>
#include "vmmarena.h"

/* Parses "MemAvailable: <n> kB" out of meminfo text. 0 on success, -1 if absent or malformed. */
int vmm_meminfo_parse(const char *text, size_t len, size_t *available);
/* Reads and parses a meminfo file (at most its first 8 KiB). */
int vmm_meminfo_read(const char *path, size_t *available);
#endif
