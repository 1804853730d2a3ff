/* Policy: the four rows of the mode table (VMM_POLICY_TABLE in internal.h), one per mode.
 * Each decision that differs between the modes reads its row's field (vmm_policy_of). */
#include "internal.h"

#define VMM_PLAIN_(type, field, plain, retain, process, scope) .field = plain,
#define VMM_RETAIN_(type, field, plain, retain, process, scope) .field = retain,
#define VMM_PROCESS_(type, field, plain, retain, process, scope) .field = process,
#define VMM_SCOPE_(type, field, plain, retain, process, scope) .field = scope,

const vmm_policy vmm_policies[2][2] = {
    {{VMM_POLICY_TABLE(VMM_PLAIN_)}, {VMM_POLICY_TABLE(VMM_RETAIN_)}},
    {{VMM_POLICY_TABLE(VMM_PROCESS_)}, {VMM_POLICY_TABLE(VMM_SCOPE_)}},
};
