/* vmmarena operation trace: one line per operation (docs/trace.md).
 *
 *   vmmtrace 1                                  first line: format name and version
 *   <t_ns> <op> <kind> <requested> <rounded> <ptr> <stream> <tag> <result>
 *
 * t_ns: nanoseconds since the trace started; op: alloc | free | begin | finish | abort |
 * pause-discard | pause-backup | resume (pause and resume: rounded = bytes affected, tag = the tag);
 * kind: package | transient | - (scope ops, and a failed alloc or free that has no kind);
 * requested and rounded: decimal bytes (0 for scope ops);
 * ptr and stream: 0x-prefixed hex; tag: the tag with '%', ' ', control bytes and bytes >= 0x7f
 * written as %XX (the tag "-" itself as %2D), or '-' for none; result: a status name (VMM_OK,
 * VMM_ERR_...).
 * Lines starting with '#' are comments. */
#ifndef VMMARENA_TRACE_H
#define VMMARENA_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vmm_trace_op {
  VMM_TRACE_ALLOC,
  VMM_TRACE_FREE,
  VMM_TRACE_BEGIN,
  VMM_TRACE_FINISH,
  VMM_TRACE_ABORT,
  VMM_TRACE_PAUSE_DISCARD,
  VMM_TRACE_PAUSE_BACKUP,
  VMM_TRACE_RESUME
} vmm_trace_op;
#define VMM_TRACE_OP_COUNT 8

#define VMM_TRACE_TAG_MAX 256

typedef struct vmm_trace_record {
  uint64_t t_ns;
  vmm_trace_op op;
  int kind;                      /* vmm_kind, or -1 for scope ops */
  uint64_t requested, rounded;
  uint64_t ptr, stream;
  char tag[VMM_TRACE_TAG_MAX];   /* decoded; "" for none */
  int result;                    /* vmm_status */
} vmm_trace_record;

typedef struct vmm_trace_writer vmm_trace_writer;

/* Opens path for writing (buffered); NULL on failure with errno set. */
VMM_API vmm_trace_writer *vmm_trace_open(const char *path);
/* rec->t_ns is a CLOCK_MONOTONIC time in ns; the line carries it as time since the open. */
VMM_API void vmm_trace_write(vmm_trace_writer *w, const vmm_trace_record *rec);
VMM_API void vmm_trace_close(vmm_trace_writer *w);

/* Formats one record as a line (with '\n'); returns its length, or the length needed if
 * cap is too small (like snprintf). */
VMM_API size_t vmm_trace_format(const vmm_trace_record *rec, char *buf, size_t cap);
/* Parses one line (without or with its '\n'). Returns 1 for a record, 0 for a header,
 * comment or blank line, -1 for a malformed line (why, if non-NULL, says what is wrong). */
VMM_API int vmm_trace_parse_line(const char *line, size_t len, vmm_trace_record *rec, const char **why);

#ifdef __cplusplus
}
#endif
#endif
