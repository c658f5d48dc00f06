/* tracekit's IFUNC helper: `ifunc PATH NAME [VERSION]` prints the address that the
 * dynamic linker resolves NAME (at VERSION) of the already loaded library PATH to,
 * in hex on the first line, then this process's /proc/self/maps.
 *
 * The tools are linked statically, so they have no dynamic linker to ask which
 * implementation an IFUNC (glibc's strlen, memcpy, ...) picks on this machine; this
 * small dynamically linked program, embedded in each tool and run from a memfd
 * (common/src/ifunc.rs), is a process that has one. RTLD_NOLOAD: only libraries
 * this program has loaded anyway (libc) are asked, so no library's constructors
 * run for the question. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: %s PATH NAME [VERSION]\n", argv[0]);
		return 2;
	}
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
	if (!h) {
		const char *e = dlerror();
		printf("not-loaded %s\n", e ? e : "");
		return 0;
	}
	void *p = argc == 4 ? dlvsym(h, argv[2], argv[3]) : dlsym(h, argv[2]);
	if (!p) {
		const char *e = dlerror();
		printf("not-resolved %s\n", e ? e : "");
		return 0;
	}
	printf("%lx\n", (unsigned long)p);
	FILE *maps = fopen("/proc/self/maps", "r");
	if (!maps)
		return 1;
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, maps)) > 0)
		fwrite(buf, 1, n, stdout);
	return fclose(maps) != 0 || fflush(stdout) != 0;
}
