/* The stand-in's replacement for binfmt_misc: loaded with LD_PRELOAD into the commands a stand-in
 * presenting as arm64-v8a runs, it turns exec of an aarch64 ELF file into exec of qemu-aarch64 with
 * that file, keeping the process id (so `exec` in a shell and signals behave as on a phone). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;
typedef int (*execve_fn)(const char *, char *const[], char *const[]);

static int is_aarch64_elf(const char *path) {
    unsigned char h[20];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, h, sizeof h);
    close(fd);
    return n == (ssize_t)sizeof h && memcmp(h, "\177ELF", 4) == 0 && h[4] == 2 && h[18] == 183 && h[19] == 0;
}

static int real_execve(const char *path, char *const argv[], char *const envp[]) {
    execve_fn fn = (execve_fn)dlsym(RTLD_NEXT, "execve");
    return fn(path, argv, envp);
}

static int exec_under_qemu(const char *path, char *const argv[], char *const envp[]) {
    const char *qemu = getenv("LAYERDIFF_STANDIN_QEMU");
    const char *cpu = getenv("LAYERDIFF_STANDIN_QEMU_CPU");
    const char *prefix = getenv("LAYERDIFF_STANDIN_QEMU_LD_PREFIX");
    int argc = 0;
    while (argv[argc]) argc++;
    char **args = calloc(argc + 12, sizeof(char *));
    if (!args) return -1;
    int k = 0;
    args[k++] = (char *)(qemu && *qemu ? qemu : "qemu-aarch64");
    args[k++] = "-cpu";
    args[k++] = (char *)(cpu && *cpu ? cpu : "max");
    args[k++] = "-U";
    args[k++] = "LD_PRELOAD";
    if (prefix && *prefix) {
        args[k++] = "-L";
        args[k++] = (char *)prefix;
    }
    args[k++] = "-0";
    args[k++] = (char *)(argc > 0 ? argv[0] : path);
    args[k++] = (char *)path;
    for (int i = 1; i < argc; i++) args[k++] = argv[i];
    args[k] = NULL;
    if (strchr(args[0], '/')) return real_execve(args[0], args, envp);
    /* find qemu on PATH */
    const char *p = getenv("PATH");
    char buf[4096];
    while (p && *p) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len + strlen(args[0]) + 2 < sizeof buf) {
            memcpy(buf, p, len);
            buf[len] = '/';
            strcpy(buf + len + 1, args[0]);
            if (access(buf, X_OK) == 0) return real_execve(buf, args, envp);
        }
        p = end ? end + 1 : NULL;
    }
    return real_execve(args[0], args, envp);
}

int execve(const char *path, char *const argv[], char *const envp[]) {
    if (is_aarch64_elf(path)) return exec_under_qemu(path, argv, envp);
    return real_execve(path, argv, envp);
}

int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }

int execvpe(const char *file, char *const argv[], char *const envp[]) {
    typedef int (*execvpe_fn)(const char *, char *const[], char *const[]);
    if (strchr(file, '/') && is_aarch64_elf(file)) return exec_under_qemu(file, argv, envp);
    execvpe_fn fn = (execvpe_fn)dlsym(RTLD_NEXT, "execvpe");
    return fn(file, argv, envp);
}

int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }
