/* Unmapping in the background (whole-process mode, VMMARENA_UNMAP=background): a retired
 * range maps handles that already serve elsewhere or wait idle, so unmapping it frees nothing;
 * yet cuMemUnmap costs 95 to 180 us a call while the device is busy (H200). One thread per
 * arena makes those calls instead of the allocation path, and the arena takes the VA back under
 * its lock at its next settle. Before any handle goes back to the driver the arena waits for
 * the queue (vmm_unmapper_wait), so what a release counts as freed is freed. The thread calls
 * only cuMemUnmap, in relaxed capture mode (so it never invalidates another thread's capture),
 * and touches only this queue under its own mutex. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define FIRST_CAP 64
#define QUIET_NS 1000000u /* after a mapping: chosen on the H200 (docs/benchmarks.md) */

/* This thread's unsafe calls must not invalidate a capture in global mode on another thread. */
static void relax_capture(vmm_arena *a) {
  if (a->drv->version < 3 || !a->drv->thread_exchange_stream_capture_mode) return;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  (void)VMM_DRV(a, thread_exchange_stream_capture_mode, &mode);
}

/* The arena's own mapping goes first: the driver makes cuMemMap, cuMemCreate and cuMemSetAccess
 * wait for an unmap under way (on the H200, 14 us a map beside an ungated thread, 5 us gated,
 * 2 us alone). Requests come in bursts (a layer's activations), so the thread also leaves a
 * quiet time after each mapping before it starts an unmap: one started between two assemblies
 * of a burst would hold up the second. */
static void yield_to_mapping(vmm_unmapper *u) {
  while (!__atomic_load_n(&u->draining, __ATOMIC_ACQUIRE)) {
    uint64_t wait_ns = 20000;
    if (!__atomic_load_n(&u->mapping, __ATOMIC_ACQUIRE)) {
      uint64_t ended = __atomic_load_n(&u->mapped_ns, __ATOMIC_ACQUIRE); /* before the clock: no wrap */
      uint64_t since = vmm_driver_now_ns() - ended;
      if (since >= u->quiet_ns) return;
      wait_ns = u->quiet_ns - since;
    }
    struct timespec nap = {(time_t)(wait_ns / 1000000000u), (long)(wait_ns % 1000000000u)};
    nanosleep(&nap, NULL);
  }
}

static void *run(void *arg) {
  vmm_arena *a = arg;
  vmm_unmapper *u = &a->unmapper;
  relax_capture(a);
  pthread_mutex_lock(&u->mu);
  for (;;) {
    while (u->done == u->count && !u->stopping) pthread_cond_wait(&u->work, &u->mu);
    if (u->done == u->count) break; /* stopping, nothing left */
    vmm_unmap_job job = u->jobs[u->done];
    pthread_mutex_unlock(&u->mu);
    yield_to_mapping(u);
    CUresult r = VMM_DRV(a, mem_unmap, job.base, job.size);
    pthread_mutex_lock(&u->mu);
    u->jobs[u->done++].result = r; /* a collect meanwhile moved this job to u->done */
    if (u->done == u->count) pthread_cond_broadcast(&u->idle);
  }
  pthread_mutex_unlock(&u->mu);
  vmm_driver_ctx_leave(a);
  return NULL;
}

/* Starts the thread once, signals blocked in it; a failure leaves the arena unmapping inline. */
static bool start(vmm_arena *a) {
  vmm_unmapper *u = &a->unmapper;
  if (u->running || u->failed) return u->running;
  u->failed = true;
  if (!u->quiet_ns) u->quiet_ns = QUIET_NS; /* unless a test chose its own */
  if (pthread_mutex_init(&u->mu, NULL)) return false;
  if (pthread_cond_init(&u->work, NULL)) goto no_work;
  if (pthread_cond_init(&u->idle, NULL)) goto no_idle;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&u->thread, NULL, run, a);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc == 0) {
    u->running = true, u->failed = false;
    return true;
  }
  vmm_errors_log(2, a->cfg.log_level, "vmmarena: no unmapper thread (pthread_create: %d): retired ranges unmap inline", rc);
  pthread_cond_destroy(&u->idle);
no_idle:
  pthread_cond_destroy(&u->work);
no_work:
  pthread_mutex_destroy(&u->mu);
  return false;
}

bool vmm_unmapper_take(vmm_arena *a, CUdeviceptr base, size_t size, uint32_t reservation) {
  vmm_unmapper *u = &a->unmapper;
  if (!a->cfg.unmap_in_background || a->destroying || !start(a)) return false;
  pthread_mutex_lock(&u->mu);
  bool room = u->count < u->cap;
  if (!room) {
    size_t cap = u->cap ? 2 * u->cap : FIRST_CAP;
    vmm_unmap_job *grown = realloc(u->jobs, cap * sizeof *grown);
    if ((room = grown != NULL)) u->jobs = grown, u->cap = cap;
  }
  if (room) {
    u->jobs[u->count++] = (vmm_unmap_job){base, size, reservation, CUDA_SUCCESS};
    u->handed++;
    u->bytes += size;
    pthread_cond_signal(&u->work);
  }
  pthread_mutex_unlock(&u->mu);
  return room;
}

void vmm_unmapper_mapping(vmm_arena *a, int delta) {
  vmm_unmapper *u = &a->unmapper;
  if (delta < 0) __atomic_store_n(&u->mapped_ns, vmm_driver_now_ns(), __ATOMIC_RELEASE);
  __atomic_add_fetch(&u->mapping, delta, __ATOMIC_RELEASE); /* balanced whether or not the thread runs */
}

void vmm_unmapper_collect(vmm_arena *a) {
  vmm_unmapper *u = &a->unmapper;
  if (!u->running) return;
  pthread_mutex_lock(&u->mu);
  for (size_t i = 0; i < u->done; i++) {
    const vmm_unmap_job *j = &u->jobs[i];
    u->bytes -= j->size;
    if (j->result == CUDA_SUCCESS) {
      vmm_ranges_free(a, j->base, j->size, j->reservation);
      continue;
    }
    vmm_errors_log(1, a->cfg.log_level, "vmmarena: unmapping the retired range 0x%llx+%zu failed: %s; it stays mapped",
            (unsigned long long)j->base, j->size, vmm_errors_cu_name(a, j->result));
    vmm_ranges_keep_stuck(a, j->base, j->size);
  }
  memmove(u->jobs, u->jobs + u->done, (u->count - u->done) * sizeof *u->jobs);
  u->count -= u->done;
  u->done = 0;
  pthread_mutex_unlock(&u->mu);
}

void vmm_unmapper_wait(vmm_arena *a) {
  vmm_unmapper *u = &a->unmapper;
  if (!u->running || !u->bytes) return; /* nothing handed over since the last collect */
  __atomic_store_n(&u->draining, 1, __ATOMIC_RELEASE); /* from inside an assembly too */
  pthread_mutex_lock(&u->mu);
  while (u->done < u->count) pthread_cond_wait(&u->idle, &u->mu);
  pthread_mutex_unlock(&u->mu);
  __atomic_store_n(&u->draining, 0, __ATOMIC_RELEASE);
  vmm_unmapper_collect(a);
}

void vmm_unmapper_stop(vmm_arena *a) {
  vmm_unmapper *u = &a->unmapper;
  if (!u->running) return;
  __atomic_store_n(&u->draining, 1, __ATOMIC_RELEASE);
  pthread_mutex_lock(&u->mu);
  u->stopping = true;
  pthread_cond_signal(&u->work);
  pthread_mutex_unlock(&u->mu);
  pthread_join(u->thread, NULL); /* it finishes the queue first */
  vmm_unmapper_collect(a);
  u->running = false;
  pthread_cond_destroy(&u->idle);
  pthread_cond_destroy(&u->work);
  pthread_mutex_destroy(&u->mu);
  free(u->jobs);
  u->jobs = NULL;
  u->cap = u->count = u->done = 0;
}
