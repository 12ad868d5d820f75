/*
 * fs/util/log.c - leveled logging: stderr in the foreground, syslog once the
 * daemon detaches. Thread-safe (one write per line).
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <syslog.h>
#include <time.h>

static enum log_level current_level = LOG_LVL_INFO;
static int to_syslog;
static _Atomic int echo_fd = -1; /* errors also go here (log_echo_errors) */

void log_set_level(enum log_level level)
{
    current_level = level;
}

enum log_level log_get_level(void)
{
    return current_level;
}

void log_use_syslog(int on)
{
    to_syslog = on;
    if (on)
        openlog("ckptfs", LOG_PID, LOG_DAEMON);
}

void log_echo_errors(int fd)
{
    echo_fd = fd;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    static const int prios[] = {LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG};
    if (level > current_level)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int echo = echo_fd;
    if (level == LOG_LVL_ERROR && echo >= 0)
        dprintf(echo, "ckptfs: %s\n", msg);
    if (to_syslog) {
        syslog(prios[level], "%s", msg);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld ckptfs %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, names[level], msg);
}
