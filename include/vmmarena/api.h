/* VMM_API marks the functions that libvmmarena.so exports. The library is built with hidden
 * visibility (VMMARENA_BUILD defined), so a function declared in an installed header links
 * only if its declaration carries VMM_API. */
#ifndef VMMARENA_API_H
#define VMMARENA_API_H

#if defined(VMMARENA_BUILD)
#define VMM_API __attribute__((visibility("default")))
#else
#define VMM_API
#endif

#endif
