/*
 * fs/util/log.h - leveled logging to stderr (or syslog when daemonized).
 *
 * One line per message, prefixed with time and level. Never pass secrets
 * (keys, tokens, signatures, Authorization headers) to these functions.
 */
#ifndef CKPTFS_LOG_H
#define CKPTFS_LOG_H

enum log_level { LOG_LVL_ERROR = 0, LOG_LVL_WARN = 1, LOG_LVL_INFO = 2, LOG_LVL_DEBUG = 3 };

void log_set_level(enum log_level level);
void log_use_syslog(int on);
/* Also write error lines ("ckptfs: MESSAGE") to fd, until called with -1: a
 * daemon's start-up errors on the terminal of whoever started it. */
void log_echo_errors(int fd);
enum log_level log_get_level(void);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_LVL_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...)                                                                             \
    do {                                                                                           \
        if (log_get_level() >= LOG_LVL_DEBUG)                                                      \
            log_msg(LOG_LVL_DEBUG, __VA_ARGS__);                                                   \
    } while (0)

#endif
