/* The pod sandbox process ("pause"): holds the pod's namespaces, reaps orphaned children when it
 * is PID 1 of a shared PID namespace, and exits 0 on SIGINT/SIGTERM. Same behaviour as
 * Kubernetes' build/pause/linux/pause.c, written for the e2e tests (built with gcc -static). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("pause (flower-addon e2e)");
    return 0;
  }
  if (getpid() != 1) {
    fprintf(stderr, "Warning: pause should be the first process\n");
  }
  struct sigaction term = {.sa_handler = on_term};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    perror("sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
  return 42;
}
