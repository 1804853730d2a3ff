/* vmmarena operation trace: one line per operation (docs/trace.md).
 *
 *   vmmtrace 2                                  first line: format name and version
 *   <t_ns> <op> <kind> <requested> <rounded> <ptr> <stream> <tag> <result> <pool>
 *
 * t_ns: nanoseconds since the trace started; op: alloc | free | begin | finish | abort |
 * pause-discard | pause-backup | resume (pause and resume: rounded = bytes affected, tag = the tag)
 * | capture-begin | capture-end | release-pool | empty-cache (rounded = bytes released) |
 * record-stream (ptr and stream) | set-limit (requested = the limit, 0 for none);
 * kind: package | transient | - (every op but alloc and free, and a failed alloc or free that
 * has no kind);
 * requested and rounded: decimal bytes (0 for scope ops);
 * ptr and stream: 0x-prefixed hex; tag: the tag with '%', ' ', control bytes and bytes >= 0x7f
 * written as %XX (the tag "-" itself as %2D), or '-' for none; result: a status name (VMM_OK,
 * VMM_ERR_...); pool: decimal vmm_pool_id, the pool asked (alloc) or named (capture-begin,
 * capture-end, release-pool), 0 (VMM_POOL_SHARED) for every other op.
 * Version 1 (the header "vmmtrace 1") has the first nine fields only and the first eight ops;
 * the reader reads both, the writer writes version 2.
 * Lines starting with '#' are comments. Every byte of a line is printable ASCII (0x20 to 0x7e)
 * and fields are separated by exactly one space. */
#ifndef VMMARENA_TRACE_H
#define VMMARENA_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../vmmarena.h" /* vmm_status */
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
  VMM_TRACE_RESUME,
  VMM_TRACE_CAPTURE_BEGIN, /* version 2 on: the calls of whole-process mode */
  VMM_TRACE_CAPTURE_END,
  VMM_TRACE_RELEASE_POOL,
  VMM_TRACE_EMPTY_CACHE,
  VMM_TRACE_RECORD_STREAM,
  VMM_TRACE_SET_LIMIT /* version 2: vmm_arena_set_limit, and the limit in force when a trace starts */
} vmm_trace_op;
#define VMM_TRACE_OP_COUNT 14
#define VMM_TRACE_V1_OP_COUNT 8 /* the ops a version 1 trace can hold: alloc to resume */

#define VMM_TRACE_VERSION 2 /* the version the writer writes; the reader reads 1 and 2 */

#define VMM_TRACE_TAG_MAX 256

typedef struct vmm_trace_record {
  uint64_t t_ns;
  vmm_trace_op op;
  int kind;                      /* vmm_kind, or -1 for scope ops */
  uint64_t requested, rounded;
  uint64_t ptr, stream;
  char tag[VMM_TRACE_TAG_MAX];   /* decoded; "" for none */
  int result;                    /* vmm_status */
  uint64_t pool;                 /* vmm_pool_id: alloc and the pool ops; 0 otherwise and in version 1 */
} vmm_trace_record;

/* The op's name as a trace line writes it ("alloc", "set-limit", ...); "?" for no op. */
VMM_API const char *vmm_trace_op_name(vmm_trace_op op);

typedef struct vmm_trace_writer vmm_trace_writer;

/* Opens path for writing (buffered); NULL on failure with errno set. */
VMM_API vmm_trace_writer *vmm_trace_open(const char *path);
/* rec->t_ns is a CLOCK_MONOTONIC time in ns; the line carries it as time since the open. */
VMM_API void vmm_trace_write(vmm_trace_writer *w, const vmm_trace_record *rec);
VMM_API void vmm_trace_close(vmm_trace_writer *w);

/* Formats one record as a line of the current version (with '\n'); returns its length, or
 * the length needed if cap is too small (like snprintf). */
VMM_API size_t vmm_trace_format(const vmm_trace_record *rec, char *buf, size_t cap);
/* Parses one line of a version `version` trace (1 or 2), of exactly len bytes, without or
 * with its line end ("\n" or "\r\n"). Returns 1 for a record (filled into *rec; pool 0 in
 * version 1), 0 for a header ("vmmtrace 1" or "vmmtrace 2", whatever `version` is), a comment
 * (a line that begins with '#') or an empty line, and -1 for a malformed line: a byte outside
 * printable ASCII (0x20 to 0x7e), fields not separated by exactly one space, another header,
 * a field count other than the version's (9 in version 1, 10 in version 2), an op the version
 * does not have, a field that does not read, a kind or a pool on an op that takes none
 * (docs/trace.md lists each), or a version other than 1 or 2. On -1, *why (if why is
 * non-NULL) is one line of printable ASCII saying what is wrong, quoting the field ("unknown
 * operation \"allc\" (alloc, free, ...)"); it lives in a buffer of the calling thread, valid
 * until that thread's next call. *rec is written only for a record or a malformed record
 * line. */
VMM_API int vmm_trace_parse_line_version(const char *line, size_t len, int version, vmm_trace_record *rec,
                                         const char **why);
/* vmm_trace_parse_line_version of the current version (VMM_TRACE_VERSION): the lines that
 * vmm_trace_format writes. */
VMM_API int vmm_trace_parse_line(const char *line, size_t len, vmm_trace_record *rec, const char **why);

/* ---- Reading a trace file ------------------------------------------------------------ */

typedef struct vmm_trace_reader vmm_trace_reader;

/* Reads the whole trace file at path into memory and checks it: a file that begins with the
 * gzip magic bytes (1f 8b) is decompressed first, by running `gzip -dc` (found on PATH);
 * the first line must be exactly "vmmtrace 1" or "vmmtrace 2"; every later line must be a
 * record of that version, a comment or empty by vmm_trace_parse_line_version (a second header
 * is refused); the last line may lack its '\n'.
 *
 * Returns VMM_OK and *out, a reader that hands the records out in order
 * (vmm_trace_reader_next; free it with vmm_trace_reader_close). Otherwise *out is NULL and
 * the status is VMM_ERR_INVALID_ARGUMENT (a NULL argument, a file that cannot be opened or
 * read, an empty file, gzip data that is truncated or corrupt or that gzip could not
 * decompress, a malformed line) or VMM_ERR_OUT_OF_MEMORY (no host memory for the file).
 * Whatever the status, msg (cap bytes, NUL-terminated, truncated to fit; may be NULL when
 * cap is 0) gets one line of printable ASCII, "" on success; it names the file (bytes
 * outside printable ASCII written \xNN, '\' and '"' escaped; "vmm_trace_reader_open" instead
 * for a NULL argument) and, for a bad line, its number and what is wrong:
 *   default.trace.gz: line 12: unknown operation "allc" (alloc, free, begin, finish, abort,
 *   pause-discard, pause-backup, resume, capture-begin, capture-end, release-pool, empty-cache,
 *   record-stream, set-limit)
 * The first problem is reported; nothing is printed. The file is not changed; the calling
 * process's file descriptors, signal dispositions and environment are left as they were (gzip
 * runs as a child process, waited for before the call returns). */
VMM_API vmm_status vmm_trace_reader_open(const char *path, vmm_trace_reader **out, char *msg, size_t cap);
/* Number of records in the trace (lines that are neither the header, a comment nor empty). */
VMM_API size_t vmm_trace_reader_records(const vmm_trace_reader *r);
/* The path as the messages write it (escaped as above), for the caller's own messages about
 * the trace ("NAME: line 7: ..."). Valid until vmm_trace_reader_close. */
VMM_API const char *vmm_trace_reader_name(const vmm_trace_reader *r);
/* The next record, in file order: returns 1 and fills *rec and *line (its 1-based line
 * number; line may be NULL), or 0 when every record has been handed out. */
VMM_API int vmm_trace_reader_next(vmm_trace_reader *r, vmm_trace_record *rec, size_t *line);
/* Frees the reader and its copy of the file; NULL is a no-op. */
VMM_API void vmm_trace_reader_close(vmm_trace_reader *r);

#ifdef __cplusplus
}
#endif
#endif
