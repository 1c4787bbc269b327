#include "keepsake/version.h"

const char *ks_version(void) { return KS_VERSION_STRING; }
