/* Two bash loadable builtins for guest/init's agent, which enables them at boot
 * ("enable -f /usr/lib/labctl/builtins.so labctl_clock labctl_rename"):
 *
 *   labctl_clock SECONDS.NANOSECONDS   the wall clock (CLOCK_REALTIME) set to that
 *   labctl_rename OLD NEW              rename(2), within one file system
 *
 * Both run in the shell's own process. In a guest just restored from a post-boot
 * snapshot under TCG, the first program run costs about 0.2 s of fresh translation
 * (fork, exec, dynamic linking); date -s and mv were those programs on every warm
 * start and reset. Built on the host when the image is built (labctl.image.build,
 * with the host's bash-builtins headers); without it the agent runs date and mv. */
#include <config.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "builtins.h"
#include "shell.h"
#include "common.h"

/* The n digits at s as a number below limit; -1 for anything else. */
static long long digits(const char *s, size_t n, long long limit)
{
    long long v = 0;
    size_t i;

    if (n == 0 || n > 18)
        return -1;
    for (i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v < limit ? v : -1;
}

static int labctl_clock_builtin(WORD_LIST *list)
{
    const char *arg, *dot;
    struct timespec ts;
    long long sec = -1, nsec = -1;

    if (list == NULL || list->next != NULL) {
        builtin_usage();
        return EX_USAGE;
    }
    arg = list->word->word;
    dot = strchr(arg, '.');
    if (dot != NULL && strlen(dot + 1) == 9) {
        sec = digits(arg, (size_t)(dot - arg), 1LL << 40);
        nsec = digits(dot + 1, 9, 1000000000LL);
    }
    if (sec < 0 || nsec < 0) {
        builtin_error("%s: not SECONDS.NANOSECONDS (nine digits after the point)", arg);
        return EXECUTION_FAILURE;
    }
    ts.tv_sec = (time_t)sec;
    ts.tv_nsec = (long)nsec;
    if (clock_settime(CLOCK_REALTIME, &ts) != 0) {
        builtin_error("%s", strerror(errno));
        return EXECUTION_FAILURE;
    }
    return EXECUTION_SUCCESS;
}

static int labctl_rename_builtin(WORD_LIST *list)
{
    if (list == NULL || list->next == NULL || list->next->next != NULL) {
        builtin_usage();
        return EX_USAGE;
    }
    if (rename(list->word->word, list->next->word->word) != 0) {
        builtin_error("%s: %s", list->word->word, strerror(errno));
        return EXECUTION_FAILURE;
    }
    return EXECUTION_SUCCESS;
}

static char *labctl_clock_doc[] = {
    "Set the wall clock (CLOCK_REALTIME) to SECONDS.NANOSECONDS since the epoch.",
    (char *)NULL
};

static char *labctl_rename_doc[] = {
    "Rename OLD to NEW (rename(2): NEW is replaced, both on one file system).",
    (char *)NULL
};

struct builtin labctl_clock_struct = {
    "labctl_clock", labctl_clock_builtin, BUILTIN_ENABLED, labctl_clock_doc,
    "labctl_clock SECONDS.NANOSECONDS", 0
};

struct builtin labctl_rename_struct = {
    "labctl_rename", labctl_rename_builtin, BUILTIN_ENABLED, labctl_rename_doc,
    "labctl_rename OLD NEW", 0
};
