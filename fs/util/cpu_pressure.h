/*
 * fs/util/cpu_pressure.h - how contended the CPUs are, from the kernel's pressure
 * stall information (PSI, /proc/pressure/cpu): the share of wall time in
 * which at least one runnable task waited for a CPU ("some"). Staged uploads
 * use it to yield to a trainer that is writing on a busy machine, whatever
 * scheduling groups (autogroups, cgroups) the processes are in.
 *
 * Not thread-safe: callers serialize (the stager calls it under its lock).
 */
#ifndef CKPTFS_CPU_PRESSURE_H
#define CKPTFS_CPU_PRESSURE_H

#include <stdint.h>

#define CPU_PRESSURE_FILE "/proc/pressure/cpu"
#define CPU_PRESSURE_WINDOW 0.1 /* seconds: the shortest window a share is taken over */

struct cpu_pressure;

/* Open the PSI file at path (CPU_PRESSURE_FILE in the daemon): 0, or a
 * negative errno when the kernel has none (no CONFIG_PSI, psi=0, an old kernel). */
int cpu_pressure_open(const char *path, struct cpu_pressure **out);

/* Close it (NULL is a no-op). */
void cpu_pressure_close(struct cpu_pressure *p);

/* What cpu_pressure_share() returns when the file cannot be read (or
 * parsed) any more: the pressure is not known and will not be. */
#define CPU_PRESSURE_UNREADABLE (-2.0)

/* The share (0..1) of the latest window of at least CPU_PRESSURE_WINDOW
 * seconds ending at or before now (monotonic seconds) in which some task
 * waited for a CPU; the file is read again only once such a window has
 * passed. -1 (unknown yet) after the first reading or after a gap of over
 * ten windows between readings; CPU_PRESSURE_UNREADABLE if a read fails. */
double cpu_pressure_share(struct cpu_pressure *p, double now);

/* Parse the "some ... total=N" microseconds out of a PSI file's text: 0, or
 * -EINVAL. (Exposed for the unit tests.) */
int cpu_pressure_parse(const char *text, uint64_t *total_us);

#endif
