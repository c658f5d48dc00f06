/* tracekit's IFUNC helper: `ifunc PATH NAME[@VERSION]...` prints, for each NAME
 * (at VERSION) of the already loaded library PATH, the address the dynamic linker
 * resolves it to, in hex, or `not-resolved REASON`, a line each; then a line
 * `maps` and this process's /proc/self/maps. If PATH is not loaded here it prints
 * only `not-loaded`.
 *
 * The tools are linked statically, so they have no dynamic linker to ask which
 * implementation an IFUNC (glibc's strlen, memcpy, ...) picks on this machine; this
 * small dynamically linked program, embedded in each tool and run from a memfd
 * (common/src/user/ifunc.rs), is a process that has one. RTLD_NOLOAD: only libraries
 * this program has loaded anyway (libc) are asked, so no library's constructors
 * run for the question. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s PATH NAME[@VERSION]...\n", argv[0]);
		return 2;
	}
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
	if (!h) {
		printf("not-loaded\n");
		return fflush(stdout) != 0;
	}
	for (int i = 2; i < argc; i++) {
		char *version = strchr(argv[i], '@');
		if (version)
			*version++ = '\0';
		dlerror();
		void *p = version ? dlvsym(h, argv[i], version) : dlsym(h, argv[i]);
		if (p) {
			printf("%lx\n", (unsigned long)p);
		} else {
			const char *e = dlerror();
			printf("not-resolved %s\n", e ? e : "");
		}
	}
	printf("maps\n");
	FILE *maps = fopen("/proc/self/maps", "r");
	if (!maps)
		return 1;
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, maps)) > 0)
		fwrite(buf, 1, n, stdout);
	return fclose(maps) != 0 || fflush(stdout) != 0;
}
