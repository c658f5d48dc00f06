/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The counting window. Probes are attached and detached one at a time, so each
 * would count over a window of its own and a caller and its callee would
 * disagree (usleep 2735, nanosleep 2740, clock_nanosleep 2744). User space sets
 * `armed` once every probe is attached and clears it before the final summary
 * and the detach (common/src/attach/armed.rs); programs check it first. Its own
 * section, so that user space writes this byte alone. */
#ifndef TRACEKIT_ARMED_H
#define TRACEKIT_ARMED_H

volatile bool armed SEC(".data.armed") = false;

#endif
