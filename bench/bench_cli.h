/* The command line every C tool of bench/ shares: --help (or -h) prints the tool's usage on
 * standard output and exits 0; --version prints "NAME VERSION" and exits 0, VERSION being the
 * project's version in CMakeLists.txt (bench/CMakeLists.txt passes it as VMMARENA_VERSION); an
 * option the tool does not know exits 2 with one line on standard error. */
#ifndef VMMARENA_BENCH_CLI_H
#define VMMARENA_BENCH_CLI_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef VMMARENA_VERSION
#error "VMMARENA_VERSION: bench/CMakeLists.txt defines it from the project's version"
#endif

/* Answers --help and --version (and exits); returns for any other argument. */
static inline void bench_cli_help_or_version(const char *name, const char *usage, const char *arg) {
  if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
    fputs(usage, stdout);
    exit(0);
  }
  if (!strcmp(arg, "--version")) {
    printf("%s %s\n", name, VMMARENA_VERSION);
    exit(0);
  }
}

/* Refuses arg in one line and exits 2. */
static inline void bench_cli_refuse(const char *name, const char *arg) {
  if (arg[0] == '-' && arg[1] != '\0') fprintf(stderr, "%s: unknown option %s (%s --help)\n", name, arg, name);
  else fprintf(stderr, "%s: unexpected argument \"%s\" (%s --help)\n", name, arg, name);
  exit(2);
}

/* The whole command line of a tool that takes no arguments: --help, --version, or refused. */
static inline void bench_cli_no_arguments(int argc, char **argv, const char *name, const char *usage) {
  for (int i = 1; i < argc; i++) {
    bench_cli_help_or_version(name, usage, argv[i]);
    bench_cli_refuse(name, argv[i]);
  }
}

#endif
