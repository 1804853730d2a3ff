/* Host MemAvailable, the memory figure that decides headroom on unified-memory GPUs. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "meminfo.h"

int vmm_meminfo_parse(const char *text, size_t len, size_t *available) {
  const char key[] = "MemAvailable:";
  const char *p = text, *end = text + len;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    if ((size_t)(eol - p) > sizeof key - 1 && !memcmp(p, key, sizeof key - 1)) {
      const char *q = p + sizeof key - 1;
      while (q < eol && (*q == ' ' || *q == '\t')) q++;
      if (q == eol || *q < '0' || *q > '9') return -1;
      unsigned long long kib = 0;
      while (q < eol && *q >= '0' && *q <= '9') {
        if (kib > (~0ull - 9) / 10) return -1;
        kib = kib * 10 + (unsigned)(*q++ - '0');
      }
      while (q < eol && (*q == ' ' || *q == '\t')) q++;
      if (eol - q < 2 || memcmp(q, "kB", 2)) return -1;
      q += 2;
      while (q < eol && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
      if (q != eol || kib > SIZE_MAX / 1024) return -1;
      *available = (size_t)kib * 1024;
      return 0;
    }
    p = eol + 1;
  }
  return -1;
}

int vmm_meminfo_read(const char *path, size_t *available) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char buf[8192];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  return vmm_meminfo_parse(buf, n, available);
}

CUresult vmm_meminfo_available(size_t *bytes) {
  return vmm_meminfo_read("/proc/meminfo", bytes) == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}
