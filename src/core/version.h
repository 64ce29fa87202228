// The commit Tetra was built from (set at configure time); every benchmark result names it.
#pragma once

namespace tetra {
const char* git_commit();
}  // namespace tetra
